"""The one sweep that several end-to-end modules read: every algorithm preset for one training step, rollouts and
evaluations on vLLM's engine where it is installed (its CPU build in CI; one engine for the whole sweep process)."""
import pytest

from core.sampling import SAMPLERS
from tests.e2e.test_sweep import TINY, _sweep

ALGOS = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "gpg", "gmpo", "quatro", "tr_grpo", "tr_grpo_literal", "exppo",
         "grpo_h", "grpo_ur", "f_grpo"]
VLLM = SAMPLERS["vllm"].missing() is None
ROLLOUT = "vllm" if VLLM else "hf"
# the evaluation's own settings (tests/e2e/test_vllm.py evaluates the base model again through the CLI with them)
EVAL = ["eval.n=2", "eval.ks=[1,2]", "eval.max_prompts=2"]


@pytest.fixture(scope="session")
def all_algos_dir(tmp_path_factory):
    """Every algorithm preset, one step each, with LoRA adapters (train.lora.rank=4) on the tiny model, in one sweep."""
    cwd = tmp_path_factory.mktemp("algos")
    proc = _sweep(cwd, "-m", f"algo={','.join(ALGOS)}", *TINY, f"train.rollout.sampler={ROLLOUT}", f"eval.sampler={ROLLOUT}",
                  "train.steps=1", "train.max_new_tokens=16", "train.lora.rank=4", *EVAL, "report.enabled=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, proc
