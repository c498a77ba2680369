"""verl's real trainer on the CPU: ``engine=verl engine.device=cpu`` trains ExPPO and DAPO end to end (Ray, an FSDP2
actor and reference on gloo, vLLM's CPU build as the rollout server, weights synced into vLLM in place, verl
checkpoints, the Hugging Face export, the usual evaluation), one sweep of two points of the ``verl_smoke`` preset (its
four algorithms cost a minute of start-up each; these two cover what only the real trainer shows: the estimator's
old log-probs handed over by the ``compute_advantage`` wrapper, the estimator's metrics, verl's group filter and DAPO's
reward manager), the first stopped (SIGTERM) inside the step after its first checkpoint, which it must honour within
seconds, and resumed by running the same command again. TR-GRPO,
whose weighted KL needs the reference log-probs the ``ppo_loss`` wrapper hands over, takes its step through verl's
trainer in the search-agent test below.

The tiny random model scores 0 on every real task, so the points train on ``toy_parity`` (tests/plugins/toy_tasks.py):
a response is correct when it has an even number of characters, so rewards vary within a group and gradients are
non-zero, except on every fourth prompt, never answered correctly: the zero-variance groups DAPO's group filter evicts. What each check compares with comes from outside verl's run: the names of the metrics the
registered functions return when called directly, the KL of the policy to its reference (what stale weights in vLLM
would show as rollout/actor mismatch), DAPO's overlong penalty computed by hand, and the weights of the starting model.
"""
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (scripts/install.sh installs it)")
pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (scripts/install.sh installs it)")

from tests.e2e.test_sweep import REPO  # noqa: E402

ALGOS = ["exppo", "dapo"]  # two of the preset's four (given on the command line, this replaces the preset's sweep)
STEPS = 3  # the first point is stopped after its first checkpoint: at least one step is left for the resumed run
# the README's command (experiment=verl_smoke: tiny random model, toy_parity, 4 prompts x 4 samples x 16 tokens) with
# a checkpoint every step and one step more, so that the stopped point has training left when it resumes
# with token-level TIS (train.rollout.correction): verl's own rollout correction, its weights on the suite's loss
# and the validation along training inside verl's loop (issue 69): every step, 4 held-out prompts x 2 samples
COMMAND = ["-m", "experiment=verl_smoke", f"algo={','.join(ALGOS)}", f"train.steps={STEPS}", "train.checkpoint_every=1",
           "train.rollout.correction=token_tis", "report.enabled=false", "train.validate_every=1",
           "data.validation_prompts=4", "eval.validation.n=2", "eval.validation.k=2"]


def _sweep_proc(cwd):  # a fresh interpreter: through the fork server (tests/prewarmed.py) the stop below went unheeded
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen([sys.executable, str(REPO / "sweep.py"), *COMMAND], cwd=cwd, env=env, text=True,
                            stdout=open(cwd / "sweep.out", "a"), stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def verl_sweep(tmp_path_factory):
    """The sweep, stopped (SIGTERM, as a user's or a scheduler's) once its first point has its first verl checkpoint
    and its first step's metrics, then the same command again. Returns ``(cwd, first exit code, checkpointed steps
    when stopped, steps logged when stopped, second exit code, seconds from the signal to the exit)``: verl saves a
    step's checkpoint before it logs the step, so the stop may leave a checkpoint ahead of the log, which the resumed
    run must not skip."""
    cwd = tmp_path_factory.mktemp("verl_cpu")
    first = _sweep_proc(cwd)
    deadline, point = time.time() + 900, None
    while time.time() < deadline and first.poll() is None and point is None:
        for d in cwd.glob("multirun/verl_smoke/*/0"):
            metrics = d / "verl_metrics.jsonl"
            if (d / "verl_checkpoints" / "latest_checkpointed_iteration.txt").is_file() and metrics.is_file() \
                    and metrics.read_bytes().count(b"\n") >= 1:
                point = d
        time.sleep(0.2)
    assert point is not None, (cwd / "sweep.out").read_text()[-3000:]
    # verl is inside its next step by now (it checkpoints a step as the step ends and starts the next at once)
    t0 = time.monotonic()
    first.send_signal(signal.SIGTERM)
    first_rc = first.wait(timeout=300)
    stop_s = time.monotonic() - t0
    stopped_at = int((point / "verl_checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    client, trained = _trained(cwd)
    logged = len(_history(client, trained["exppo"], "train/reward_mean"))
    second = _sweep_proc(cwd)
    second_rc = second.wait(timeout=2400)
    return cwd, first_rc, stopped_at, logged, second_rc, stop_s


def _trained(cwd):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("verl_smoke").experiment_id], max_results=100)
    return client, {r.data.params["algo.name"]: r for r in runs if r.data.tags.get("rlvr.kind") == "trained"}


def _history(client, run, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def _own_metrics(algo) -> set[str]:
    """``train/<name>`` for every finite metric the algorithm's registered estimator and policy loss return when called
    directly on a batch of two groups of four (the names the local engine logs)."""
    from orchestrator.checks.preflight import sweep_points
    from training.algorithms import get_advantage_fn, get_policy_loss_fn
    from training.batch import RolloutBatch
    from training.engines.verl import algo_spec

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", f"algo={algo}"])
    spec = algo_spec(cfg)
    g = torch.Generator().manual_seed(0)
    B, L = 8, 6
    mask = torch.ones(B, L)
    old = -torch.rand(B, L, generator=g) * 3
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    batch = RolloutBatch(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
                         response_ids=torch.ones(B, L, dtype=torch.long), response_mask=mask, old_logprobs=old,
                         rewards=rewards, group_index=torch.arange(B) // 4, response_lengths=torch.full((B,), L),
                         ref_logprobs=old + 0.1 * torch.randn(B, L, generator=g), correct=rewards > 0)
    adv, adv_metrics = get_advantage_fn(spec["advantage"]["name"])(batch, **spec["advantage"]["params"])
    new = (old + 0.05 * torch.randn(B, L, generator=g)).requires_grad_(True)
    _, loss_metrics = get_policy_loss_fn(spec["policy_loss"]["name"])(new, batch, adv, **spec["policy_loss"]["params"])
    return {f"train/{k}" for k, v in {**adv_metrics, **loss_metrics}.items()
            if v is not None and not isinstance(v, bool) and math.isfinite(float(v))}


def test_sweep_is_stopped_then_finishes_with_every_point_trained(verl_sweep):
    cwd, first_rc, stopped_at, logged, second_rc, stop_s = verl_sweep
    out = (cwd / "sweep.out").read_text()
    assert first_rc != 0 and "Run the same command again to resume" in out
    # a stop inside verl's step is honoured at once (verl's processes stopped, the run marked), not at the step's end
    assert stop_s < 10, stop_s
    assert second_rc == 0, out[-4000:]
    client, trained = _trained(cwd)
    assert sorted(trained) == sorted(ALGOS)
    assert all(r.info.status == "FINISHED" for r in trained.values())
    assert 1 <= min(stopped_at, logged) < STEPS  # stopped before verl's last step: the resumed run had steps left


def test_the_resumed_run_logs_every_step_once(verl_sweep):
    cwd, _, stopped_at, logged, _, _ = verl_sweep
    client, trained = _trained(cwd)
    run = trained["exppo"]
    for key in ("train/reward_mean", "train/grad_norm", "verl/timing_s/step"):
        assert [s for s, _ in _history(client, run, key)] == list(range(STEPS)), key
    log = (Path(run.data.tags["rlvr.run_dir"]) / "verl.log").read_text(errors="replace")
    # the second attempt continued from verl's checkpoint (same run folder, same MLflow run), not from scratch: from
    # the newest one whose steps were all logged (a checkpoint ahead of the log is set aside, its step trained again)
    resumed_from = min(stopped_at, logged)
    assert re.search(rf"Resuming from \S*global_step_{resumed_from}\b", log), log[-3000:]
    rewound = "holds steps whose metrics were never logged" in (cwd / "sweep.out").read_text()
    assert rewound == (stopped_at > logged)
    assert int(run.data.tags["rlvr.requeue_count"]) >= 1


@pytest.mark.parametrize("algo", ALGOS)
def test_each_algorithm_trains_through_verls_trainer(verl_sweep, algo):
    cwd = verl_sweep[0]
    client, trained = _trained(cwd)
    run = trained[algo]
    m = run.data.metrics
    grad = _history(client, run, "train/grad_norm")
    assert [s for s, _ in grad] == list(range(STEPS)) and all(v > 0 for _, v in grad)
    # the estimator's and the loss's own metrics, computed inside verl's Ray workers, under the local engine's names
    missing = _own_metrics(algo) - set(m)
    assert not missing, missing
    # verl's rollout correction (train.rollout.correction=token_tis -> algorithm.rollout_correction) ran every step,
    # its weights handed to the suite's loss (training/engines/verl/verl_adapters.py::verl_policy_loss)
    assert [s for s, _ in _history(client, run, "verl/rollout_corr/rollout_is_mean")] == list(range(STEPS))
    for key in _own_metrics(algo):
        assert [s for s, _ in _history(client, run, key)] == list(range(STEPS)), key
    # the exported Hugging Face checkpoint went through the usual evaluation in the same run...
    assert [s for s, _ in _history(client, run, "eval/toy_parity/pass_at_1")] == [STEPS]
    assert "samples.parquet" in {a.path for a in client.list_artifacts(run.info.run_id)}
    # ...and it holds the trained weights, not the starting ones
    from safetensors.torch import load_file

    run_dir = Path(run.data.tags["rlvr.run_dir"])
    start = load_file(next((run_dir / "initial_model").glob("*.safetensors")))
    final = load_file(next((run_dir / "checkpoint").glob("*.safetensors")))
    moved = [k for k in start if k in final and not torch.equal(start[k].float(), final[k].float())]
    assert len(moved) > len(start) // 2


@pytest.mark.parametrize("algo", ALGOS)
def test_verl_validates_inside_its_loop_with_the_suites_tables_and_compute(verl_sweep, algo):
    """Issue 69 on verl: verl's own periodic validation samples the 4 held-out prompts before training and after every
    step; the suite grades each point and logs its tables at the point's step, once (the stopped and resumed ExPPO
    point too): pass@1 equals verl's own aggregate of the same samples (``val-core/.../acc/mean@2``, which verl logs
    with the step's metrics, at step k - 1), and ``val/compute_flops`` is the sum of the ``train/flops`` before it
    (training/compute.py's count on verl's token counts)."""
    client, trained = _trained(verl_sweep[0])
    run = trained[algo]
    p1 = _history(client, run, "val/toy_parity/pass_at_1")
    assert [s for s, _ in p1] == list(range(STEPS + 1))
    assert [s for s, _ in _history(client, run, "val/toy_parity/maj_at_2")] == list(range(STEPS + 1))
    flops = dict(_history(client, run, "train/flops"))
    assert sorted(flops) == list(range(STEPS)) and all(v > 0 for v in flops.values())
    assert dict(_history(client, run, "val/compute_flops")) == {k: sum(v for s, v in flops.items() if s < k)
                                                                 for k in range(STEPS + 1)}
    verl_acc = dict(_history(client, run, "verl/val-core/rlvr/toy_parity/acc/mean_at_2"))
    for k, value in p1[1:]:
        assert value == pytest.approx(verl_acc[k - 1]), k
    assert run.data.tags["rlvr.val_protocol"].startswith("verl:vllm (")
    assert "validation.parquet" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.parametrize("algo", ["exppo"])  # DAPO has no KL to its reference to compare with
def test_trained_weights_reach_vllm_after_every_step(verl_sweep, algo):
    """verl's rollout/actor mismatch (the KL between vLLM's and the actor's log-probs of the sampled tokens) stays at
    the bf16-vs-fp32 level, far below how far the policy has moved from its start (its KL to the reference): had
    vLLM kept the starting weights, the mismatch after an update would be that KL."""
    client, trained = _trained(verl_sweep[0])
    run = trained[algo]
    mismatch = dict(_history(client, run, "verl/rollout_corr/k3_kl"))
    moved = dict(_history(client, run, "train/kl_ref"))
    for step in range(1, STEPS):
        assert moved[step] > 0.001 and mismatch[step] < moved[step] / 10, (step, mismatch[step], moved[step])


def test_dapo_filters_groups_and_shapes_overlong_rewards(verl_sweep):
    """DAPO's dynamic sampling is verl's own group filter on correctness: the never-correct prompts' groups are evicted
    and refilled, so no group the estimator sees lacks variance (ExPPO, unfiltered, sees them); its overlong shaping is
    verl's DAPO reward manager with the suite's buffer: every response has the maximum 16 tokens, 3 past the start of
    the buffer (20% of 16, rounded down), so each reward is its correctness minus 3/3 x penalty_factor 1.0."""
    client, trained = _trained(verl_sweep[0])
    dapo, exppo = trained["dapo"], trained["exppo"]
    assert all(v == 0.0 for _, v in _history(client, dapo, "train/zero_variance_share"))
    assert any(v > 0 for _, v in _history(client, exppo, "train/zero_variance_share"))
    assert sum(v for _, v in _history(client, dapo, "verl/training/filter_groups/evicted_samples")) > 0
    for step in range(STEPS):
        assert dict(_history(client, dapo, "verl/response_length/min"))[step] == 16.0
        assert dict(_history(client, dapo, "verl/critic/score/max"))[step] == 0.0    # correct: 1 - 1
        assert dict(_history(client, dapo, "verl/critic/score/min"))[step] == -1.0   # wrong: 0 - 1
    assert max(v for _, v in _history(client, exppo, "verl/critic/score/max")) == 1.0  # no shaping without the buffer


def test_search_agent_takes_a_step_through_verls_tool_agent_loop(tmp_path):
    """The search agents' twin on verl's CPU trainer, with LoRA adapters (train.lora: verl's own FSDP LoRA, its
    reference the actor with the adapters off): verl's multi-turn tool agent loop with the suite's search
    function tool, the retrieval server started for the run over the generated world's corpus (BM25), one training
    step, the usual evaluation of the exported checkpoint, which holds the adapters merged into the base (verl saves
    the peft-wrapped model: loaded as is it would be random weights): the adapted projections moved, the rest of the
    base is bit-identical to the starting model. An entropy bonus gives the adapters a gradient whatever the rewards
    (a random model's are often all 0, and the KL to the reference is 0 while B is 0). A random model never writes a function call in verl's (hermes) format, so no episode
    here calls the tool: its call path through verl's tool class is tested in tests/training/test_verl_engine.py."""
    from tests.e2e.test_sweep import _sweep

    proc = _sweep(tmp_path, "engine=verl", "engine.device=cpu", "model=tiny-random", "data=search_demo",
                  "eval=search_demo", "algo=tr_grpo", "train.steps=1", "train.prompts_per_step=2", "train.group_size=4",
                  "train.minibatch_size=8", "train.max_new_tokens=16", "tools.max_turns=1", "tools.max_obs_tokens=48",
                  "eval.max_prompts=2", "eval.n=2", "eval.ks=[1,2]", "eval.ucc_ks=[2]", "eval.max_new_tokens=16",
                  "eval.base=false", "engine.gradient_checkpointing=false", "report.enabled=false",
                  "train.lora.rank=4", "train.lora.lr=0.01", "+algo.entropy_coef=0.01", "experiment_name=search",
                  timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    [run] = [r for r in client.search_runs([client.get_experiment_by_name("search").experiment_id])
             if r.data.tags.get("rlvr.kind") == "trained"]
    m = run.data.metrics
    assert run.info.status == "FINISHED" and "train/grad_norm" in m and "eval/search_demo/exact_match" in m
    log = (Path(run.data.tags["rlvr.run_dir"]) / "verl.log").read_text(errors="replace")
    assert "'default_agent_loop': 'tool_agent'" in log and "verl_search_tool.py" in log
    assert m["verl/num_turns/min"] >= 2  # the tool agent loop ran its turns (prompt, response)
    # TR-GRPO's own loss metrics, its weighted KL to the reference included (the reference log-probs reach the loss
    # through the ppo_loss wrapper), computed inside verl's workers, under the local engine's names
    missing = _own_metrics("tr_grpo") - set(m)
    assert not missing and "train/kl_ref" in m, missing
    # LoRA through verl: its config took the rank, the checkpoint the suite evaluated is the merged plain model
    from safetensors.torch import load_file

    assert "'lora_rank': 4" in log
    run_dir = Path(run.data.tags["rlvr.run_dir"])
    start, trained = (load_file(str(next((run_dir / d).glob("*.safetensors")))) for d in ("initial_model", "checkpoint"))
    assert start.keys() == trained.keys() and not any("lora_" in k for k in trained)
    moved = {k for k in start if not torch.equal(start[k], trained[k])}
    assert moved and all(k.endswith("_proj.weight") for k in moved)  # only adapted projections changed
