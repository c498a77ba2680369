"""The parts of the verl engine (:mod:`training.engines.verl`) that are not engines: the child process's entry point,
the reward function, the CPU platform and the search tool (a sub-package, so the engine folder scan skips them)."""
