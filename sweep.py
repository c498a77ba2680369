"""Entry point: `python sweep.py -m algo=quatro,gspo delta=0.01,0.1`.

Every sweep point is validated first, and every place the sweep writes to is checked (orchestrator.checks.preflight);
then Hydra runs each point through orchestrator.point.run, which trains, evaluates and logs to MLflow. A point that
fails is recorded as FAILED in MLflow and the other points go on; the sweep prints a summary and exits 1 if any
point did not finish, for any reason. SIGTERM or Ctrl-C (outside SLURM) saves the training state (at the end of
the running step, or at once during its generation and scoring: the last completed step's), marks the run KILLED
and exits 128 + the signal's number; the same command resumes.

The screen shows the suite's own lines; the libraries' output goes to each point's ``sweep.log`` (``--verbose``:
to the screen too; core/console.py).
"""
import logging
import os
import sys

if "--verbose" in sys.argv:  # the libraries' output on the screen too (core/console.py); not a Hydra flag
    sys.argv.remove("--verbose")
    os.environ["RLVR_VERBOSE"] = "1"
from core.console import quiet_libraries  # noqa: E402  (before vLLM or MLflow configure their own handlers)

quiet_libraries()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from orchestrator import run  # noqa: E402
from orchestrator.checks.preflight import check_command_line

log = logging.getLogger("rlvr")


@hydra.main(version_base="1.3", config_path="sweeps", config_name="config")
def main(cfg: DictConfig):
    from core.lifecycle import Interrupted, Preempted
    from orchestrator.callbacks import record_outcome

    try:
        out = run(cfg)
    except Preempted:
        raise  # submitit requeues the job
    except Interrupted as e:
        record_outcome({"status": "killed", "error": f"stopped by {_signame(e.signum)}"})
        raise
    except Exception as e:
        from orchestrator import ConfigError

        record_outcome({"status": "failed", "error": f"{type(e).__name__}: {e}"})
        if isinstance(e, ConfigError):
            raise
        log.error("point failed: %s: %s", type(e).__name__, e)
        if "-m" not in sys.argv and "--multirun" not in sys.argv:
            raise
        return {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    record_outcome(out)
    return out


def _signame(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


if __name__ == "__main__":
    from core.lifecycle import Interrupted
    from orchestrator import callbacks
    from reports.callback import check_report_baseline, check_report_config

    check_command_line(sys.argv[1:], checks=(check_report_config,),  # every point, before any work (exit 2)
                       sweep_checks=(check_report_baseline,))
    os.environ.pop(callbacks.SWEEP_DIR_ENV, None)  # set by this process's sweep when it starts
    try:
        main()
    except BaseException as e:  # the sweep did not reach its end: its parent run says how it stopped
        if not (isinstance(e, SystemExit) and e.code in (0, None)) and callbacks.current_sweep_dir() is not None:
            callbacks.end_unfinished(callbacks.current_sweep_dir(), "KILLED" if isinstance(e, (Interrupted, KeyboardInterrupt)) else "FAILED")
        if not isinstance(e, Interrupted):
            raise
        print(f"stopped by {_signame(e.signum)}" + (f": {e.where} marked KILLED" if e.where else "")
              + ("; its training state was saved" if e.state_saved else "")
              + ". Run the same command again to resume.", file=sys.stderr, flush=True)
        sys.exit(128 + e.signum)
    sweep_dir = callbacks.current_sweep_dir()
    # the sweep's callback wrote its outcome (points that did not finish, a failed base evaluation) to the sweep folder
    sys.exit(callbacks.exit_status(sweep_dir) if sweep_dir is not None else 0)
