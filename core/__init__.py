"""The bottom layer: what training and evaluation both use, importing neither of them.

- :mod:`core.models`: load a policy, a tokenizer or a checkpoint (device and dtype chosen here);
- :mod:`core.scoring`: teacher-forced log-probabilities and exact token entropies;
- :mod:`core.sampling`: samplers registered by name (``hf``: transformers, ``vllm``: vLLM's offline
  engine) behind one protocol, and the ``auto`` choice between them;
- :mod:`core.lifecycle`: the preemption flag and saved-checkpoint layout shared by every engine.
"""
