"""Every algorithm preset runs one training step through the sweep command and logs its own metrics, with LoRA
adapters (train.lora.rank=4; full fine-tuning of each algorithm runs in the presets' twins and the unit tests).

The rollouts come from vLLM's engine where it is installed (its CPU build in CI): one engine for the whole sweep
process, taking each point's policy weights in place, so every algorithm also logs the training-inference mismatch.
The sweep (tests/e2e/conftest.py) also evaluates through that engine, which tests/e2e/test_vllm.py reads.
"""
import pytest

from tests.e2e.conftest import ALGOS, ROLLOUT, VLLM
from tests.e2e.test_sweep import _runs

# metrics that only the algorithm's own estimator, loss or engine feature logs
OWN_METRICS = {
    "grpo": ["train/clip_fraction_active", "train/kl_ref"],
    "dr_grpo": ["train/clip_fraction_active"],
    "dapo": ["train/dynamic_sampling_rounds", "train/dynamic_sampling_sampled"],
    "gspo": ["train/seq_ratio_mean", "train/clip_fraction"],
    "cispo": ["train/clip_fraction", "train/ratio_mean"],
    "gpg": ["train/gpg_alpha"],
    "gmpo": ["train/seq_ratio_mean", "train/clip_fraction"],
    "quatro": ["train/reversed_share", "train/lambda_floored_groups", "train/solver_ms"],
    "tr_grpo": ["train/weight_mean", "train/weight_std"],
    "tr_grpo_literal": ["train/weight_mean", "train/weight_std"],
    "exppo": ["train/audit_correct_rare", "train/audit_wrong_common", "train/multiplier_mean"],
    "grpo_h": ["train/entropy_bonus"],
    "grpo_ur": ["train/clip_fraction"],
    "f_grpo": ["train/pass_rate_mean"],
}


MISMATCH = ["train/mismatch_logprob_abs_diff", "train/mismatch_kl", "train/mismatch_ratio_out_share",
            "train/weight_sync_time_s"] if VLLM else []


@pytest.mark.parametrize("algo", ALGOS)
def test_algorithm_runs_one_step_and_logs_its_metrics(all_algos_dir, algo):
    cwd, _ = all_algos_dir
    client, runs = _runs(cwd)
    [run] = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained" and r.data.params["algo.name"] == algo]
    assert run.info.status == "FINISHED" and run.data.tags["rlvr.kind"] == "trained"
    assert run.data.tags["rlvr.rollout_sampler"] == ROLLOUT and run.data.tags["rlvr.rollout_sampler_reason"] == "asked for"
    # precision by capability: the tests' CPU has no bf16 units (tests/conftest.py), so auto is float32, and why
    assert run.data.tags["rlvr.precision"] == "fp32" and "no bf16 units" in run.data.tags["rlvr.precision_reason"]
    for key in OWN_METRICS[algo] + MISMATCH + ["train/reward_mean"]:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0], key
    # LoRA: the adapters are what trained, a small share of the model, and the engine sampled that policy
    assert run.data.tags["rlvr.lora_rank"] == "4" and run.data.params["train.lora.rank"] == "4"
    assert 0 < run.data.metrics["model/trainable_share"] < 0.05
    assert run.data.metrics["model/adapter_mb"] == pytest.approx(run.data.metrics["model/trainable_params"] * 4 / 2**20, abs=1e-3)
    if VLLM:
        assert run.data.metrics["train/mismatch_logprob_abs_diff"] < 1e-3


def test_tr_grpo_printed_formulas_warn_loudly(all_algos_dir):
    cwd, proc = all_algos_dir
    assert "WARNING (algo=tr_grpo_literal" in proc.stderr and "constant" in proc.stderr
    assert "WARNING (algo=tr_grpo " not in proc.stderr   # the RECONSTRUCTED default reading is a real weight
    client, runs = _runs(cwd)
    trained = {r.data.params["algo.name"]: r for r in runs if r.data.tags.get("rlvr.kind") == "trained"}
    assert "constant" in trained["tr_grpo_literal"].data.tags.get("rlvr.warnings", "")
    # the printed reading weighs every token 1.0 (the default's weights need token probabilities above 0.122,
    # which a tiny random model over a 49k vocabulary does not give: its weights are 1.0 here too)
    literal = client.get_metric_history(trained["tr_grpo_literal"].info.run_id, "train/weight_std")
    assert literal[0].value == 0.0
