"""LoRA on the local engine (train.lora, core/lora.py): what trains, the reference, resume, checkpoints, evaluation,
the memory plan and the guard against a stale rollout engine. The vLLM side (merged weights after each step, greedy
continuations equal transformers') is in tests/e2e/test_vllm.py; every algorithm with LoRA in one sweep in
tests/e2e/test_all_algorithms.py."""
import json

import pytest
import torch
from omegaconf import OmegaConf

from core.lora import ADAPTER_CONFIG, LoraSettings, attach, evaluable, trainable_count
from core.models import load_policy
from training.engines import EngineChoices, local
from training.engines.local import local_generation, local_setup
from training.settings import RunSettings
from training.update import UpdateControl, update_policy


def _cfg(extra=()):
    from orchestrator.checks.preflight import sweep_points

    # GRPO-H's entropy bonus moves the weights though the random model earns no reward; the KL term reads the
    # reference (the base, adapters disabled)
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=grpo_h", "train.lora.rank=4", *extra])
    return OmegaConf.merge(cfg, {"algo": {"entropy_coef": 0.5, "kl_beta": 0.05}, "train": {
        "steps": 3, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 5, "minibatch_size": 2, "lr": 1e-3,
        "checkpoint_every": 1, "rollout": {"sampler": "hf"}}})


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted three-step LoRA run: (cfg, run folder, checkpoint, logged steps)."""
    cfg = _cfg()
    run_dir = tmp_path_factory.mktemp("lora") / "a"
    logged, choices = [], EngineChoices()
    ckpt = local.train(cfg, run_dir, lambda m, s: logged.append((s, m)), choices=choices)
    return cfg, run_dir, ckpt, logged, choices


def _adapter(ckpt):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "adapter_model.safetensors"))


@pytest.mark.slow
def test_a_stopped_and_resumed_lora_run_ends_with_the_uninterrupted_runs_adapter(straight, tmp_path):
    """Stopped once step 0 is logged, resumed: every step logged once, the same adapter to 1e-6 (here: equal), the
    state and the checkpoint hold the adapters only (peft's format, naming the base folder)."""
    cfg, _, ckpt_a, logged, _ = straight
    resumed = []

    def log_and_stop(m, s):
        resumed.append((s, m))
        if s == 0:
            local.STOP_REQUESTED.set()  # as the SIGUSR2 handler does

    try:
        with pytest.raises(local.Preempted):
            local.train(cfg, tmp_path / "b", log_and_stop)
    finally:
        local.STOP_REQUESTED.clear()
    state = local.load_state(tmp_path / "b")
    assert state["step"] == 0 and state["model"] and all("lora_" in k for k in state["model"])
    ckpt_b = local.train(cfg, tmp_path / "b", lambda m, s: resumed.append((s, m)), logged_through=0)
    assert [s for s, _ in logged] == [0, 1, 2] and [s for s, _ in resumed] == [0, 1, 2]
    a, b = _adapter(ckpt_a), _adapter(ckpt_b)
    assert a.keys() == b.keys() and len(a) == 2 * 7 * 2  # A and B of 7 projections in each of the 2 layers
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-6), k
    assert any(float(v.abs().max()) > 0 for k, v in a.items() if "lora_B" in k)  # B moved off its zero start
    assert not (ckpt_a / "model.safetensors").exists() and not (ckpt_a / "config.json").exists()
    from core.models import model_path

    conf = json.loads((ckpt_a / ADAPTER_CONFIG).read_text())
    assert conf["r"] == 4 and conf["base_model_name_or_path"] == str(__import__("pathlib").Path(model_path(cfg.model)).resolve())
    for (_, ma), (_, mb) in zip(logged, resumed):
        for key in ("train/grad_norm", "train/kl_ref", "train/entropy"):
            assert ma[key] == pytest.approx(mb[key], rel=1e-6), key
    # the adapters' learning rate is auto: 10 x train.lr
    assert logged[0][1]["train/lr"] == pytest.approx(1e-2)
    memory = straight[4].memory["parameters"]  # the engine's record (the orchestrator logs it as memory.json)
    assert memory["trainable"] == sum(v.numel() for v in a.values()) and memory["lora_rank"] == 4
    assert memory["trainable"] / memory["total"] < 0.05


@pytest.mark.slow
def test_the_evaluation_of_a_lora_checkpoint_equals_the_evaluation_of_the_adapter_merged_into_the_base(straight, tmp_path):
    """The usual evaluation of the adapter folder (evaluation.pipeline.evaluate_checkpoint) gives the samples of the
    same adapter merged into the base by peft here, and not the base model's."""
    import pandas as pd
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.models import check_source, model_path
    from core.tasks import load_prompts
    from evaluation.pipeline import EvalJob, evaluate_checkpoint

    cfg, _, ckpt, _, _ = straight
    check_source({"source": "pretrained", "path": str(ckpt)})  # orchestrator.evaluate --checkpoint takes it
    merged = tmp_path / "merged"
    base = AutoModelForCausalLM.from_pretrained(model_path(cfg.model), dtype=torch.float32)
    PeftModel.from_pretrained(base, str(ckpt)).merge_and_unload().save_pretrained(merged)
    AutoTokenizer.from_pretrained(str(ckpt)).save_pretrained(merged)
    ecfg = OmegaConf.merge(cfg.eval, {"n": 4, "ks": [1, 2], "max_prompts": 3, "temperature": 1.0, "max_new_tokens": 8,
                                      "extra_temperatures": []})
    heldout = load_prompts(cfg.data, "eval")
    out = {}
    for name, path in (("adapter", ckpt), ("merged", merged), ("base", model_path(cfg.model))):
        metrics, _, _ = evaluate_checkpoint(path, EvalJob(ecfg, heldout), tmp_path / name, sampler="hf",
                                            temperatures=False)
        out[name] = (metrics, pd.read_parquet(tmp_path / name / "samples.parquet"))
    cols = ["benchmark", "prompt_id", "sample_idx", "response", "n_tokens", "correct"]
    pd.testing.assert_frame_equal(out["adapter"][1][cols], out["merged"][1][cols])
    assert out["adapter"][0] == pytest.approx(out["merged"][0], nan_ok=True)
    assert (out["adapter"][1]["response"] != out["base"][1]["response"]).any()  # the adapter is applied
    # a folder whose base is gone is refused before any loading
    gone = tmp_path / "orphan"
    gone.mkdir()
    conf = json.loads((ckpt / ADAPTER_CONFIG).read_text())
    (gone / ADAPTER_CONFIG).write_text(json.dumps({**conf, "base_model_name_or_path": str(tmp_path / "nothing")}))
    with pytest.raises(ValueError, match="base model folder .* is gone"):
        check_source({"source": "pretrained", "path": str(gone)})
    assert evaluable(merged) == str(merged)  # a full model folder is its own evaluable form


def test_lora_settings_are_checked_at_preflight():
    for extra, match in ((["train.lora.target_modules=attn"], "train.lora.target_modules='attn'"),
                         (["train.lora.lr=fast"], "train.lora.lr='fast'"),
                         (["train.lora.dropout=0.99", "train.lora.lr=2.0"], "train.lora.lr=2.0")):
        with pytest.raises(ValueError, match=match):
            local.validate(_cfg(extra))
    with pytest.raises(ValueError, match="train.lora.lr='fast'"):  # with LoRA off too: a typo is refused
        LoraSettings(rank=0, lr="fast").check()
    assert LoraSettings(rank=8).learning_rate(1e-6) == pytest.approx(1e-5)
    assert LoraSettings(rank=8, lr=3e-5).learning_rate(1e-6) == pytest.approx(3e-5)


def test_the_memory_plan_counts_the_adapters_peft_makes(tiny_cfg):
    """The plan's adapter count equals the parameters peft adds to the tiny model (a second count), its gradients
    and optimiser state are the adapters' only, and no reference copy is planned."""
    from core.models import load_policy
    from training.memory_plan import GIB, ModelShape, RunShape, plan_memory

    model, _ = load_policy(tiny_cfg.model)
    before = sum(p.numel() for p in model.parameters())
    attach(model, LoraSettings(rank=4))
    trainable, total = trainable_count(model)
    shape = ModelShape.from_config(model.config)
    assert shape.lora_params(4, LoraSettings(rank=4).targets()) == trainable == total - before
    cfg = _cfg()
    run = RunShape.of(RunSettings.of(cfg))
    assert run.lora_rank == 4 and run.kl
    plan = plan_memory(shape, run, 512)
    assert plan.parts["optimizer"] == pytest.approx(8.0 * trainable / GIB)
    assert plan.parts["gradients"] == pytest.approx(4.0 * trainable / GIB) and plan.parts["reference"] == 0.0
    full = plan_memory(shape, RunShape.of(RunSettings.of(OmegaConf.merge(cfg, {"train": {"lora": {"rank": 0}}}))), 512)
    assert full.parts["reference"] > 0 and full.parts["optimizer"] == pytest.approx(8.0 * before / GIB)


def test_a_jump_in_the_mismatch_after_a_sync_is_an_error_naming_the_step():
    from training.mismatch import FLOAT32_LEVEL, SyncGuard

    g = SyncGuard(float32=True)
    assert g.check(0, 2e-7) is None and g.check(1, 5e-7) is None and g.check(2, None) is None
    msg = g.check(3, 0.4)
    assert msg.startswith("step 3:") and "weight sync of step 2" in msg and "stale" in msg
    assert g.check(4, FLOAT32_LEVEL / 2) is None
    b = SyncGuard(float32=False)  # bf16: a jump over 10x the first step's gap
    assert b.check(0, 0.02) is None and b.check(1, 0.05) is None and "step 2" in b.check(2, 0.5)


@pytest.mark.slow
def test_smollm2_with_rank_8_trains_under_5_percent_keeps_the_base_and_scores_the_reference_as_the_base(tmp_path):
    """The main job's model and rank (SmolLM2-135M, train.lora.rank=8): trainable parameters under 5% of the total;
    after an update every base weight is bit-identical to a separately loaded base model's, and the KL term's
    reference log-probs equal that model's to 1e-6."""
    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(["train.lora.rank=8", "algo=grpo", "algo.kl_beta=0.04", "train.rollout.sampler=hf",
                               "train.prompts_per_step=2", "train.group_size=2", "train.max_new_tokens=12",
                               "train.minibatch_size=4"])
    run = local_setup.setup(RunSettings.of(cfg), tmp_path, {})
    trainable, total = trainable_count(run.model)
    assert run.ref_model is run.model and trainable / total < 0.05
    ro = local_generation.generate(run, 0)
    update_policy(run.model, run.optimizer, ro.batch, ro.advantages, run.loss, run.update, run.scorer,
                  UpdateControl(torch.Generator().manual_seed(0)))
    base, _ = load_policy(cfg.model)
    names = {k.replace(".base_layer", ""): v for k, v in run.model.state_dict().items() if "lora_" not in k}
    assert sorted(names) == sorted(base.state_dict())
    assert all(torch.equal(names[k], v) for k, v in base.state_dict().items())
    assert any(float(v.abs().max()) > 0 for k, v in run.model.state_dict().items() if "lora_B" in k)  # it trained
    b = ro.batch
    with torch.no_grad():
        own, _ = run.scorer.score(base, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                  float(cfg.train.temperature))
    m = b.response_mask.bool()
    assert (b.ref_logprobs - own)[m].abs().max() < 1e-6


def test_the_report_labels_lora_runs_as_the_suites_choice_with_their_learning_rate_rule():
    import pandas as pd

    from reports.data import lora_notes

    runs = pd.DataFrame({
        "label": ["grpo", "exppo", "base", "gspo"], "kind": ["trained", "trained", "base", "trained"],
        "params": [{"train.lora.rank": "32", "train.lora.alpha": "32", "train.lora.target_modules": "all-linear",
                    "train.lora.lr": "auto", "train.lr": "1e-06"},
                   {"train.lora.rank": "32", "train.lora.alpha": "32", "train.lora.target_modules": "all-linear",
                    "train.lora.lr": "auto", "train.lr": "1e-06"},
                   {}, {"train.lora.rank": "0", "train.lr": "1e-06"}]})
    [line] = lora_notes(runs)
    assert line.startswith("LoRA adapters on a frozen base (rank 32, alpha 32, on all-linear, learning rate 10 x "
                           "train.lr (1e-06)") and "for grpo, exppo:" in line and "not the paper's protocol" in line
    assert lora_notes(runs.iloc[2:]) == []  # full fine-tuning and the base model: no note


def test_lora_gradients_are_the_same_with_checkpointing_micro_batches_and_bf16(tmp_path):
    """The adapters' gradient of one minibatch (the whole rollout) is the one-pass gradient with gradient checkpointing
    and micro-batches of one sequence each (exact accumulation, issue 45) to float rounding, and with bf16 autocast to
    bf16's precision; the base gets none."""
    class Capture:  # the optimiser's place in the update: records the clipped gradients it would apply
        def __init__(self, model):
            self.model, self.grads = model, None

        def zero_grad(self, set_to_none=True):
            self.model.zero_grad(set_to_none=True)

        def step(self):
            self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    batch = None
    grads = {}
    for name, extra in (("one pass", {"micro_batch_tokens": None}),
                        ("checkpointed micro-batches", {"micro_batch_tokens": 64, "gradient_checkpointing": True}),
                        ("bf16", {"micro_batch_tokens": None, "precision": "bf16"})):
        cfg = OmegaConf.merge(_cfg(), {"train": {"minibatch_size": 4, **extra}})
        run = local_setup.setup(RunSettings.of(cfg), tmp_path / name.replace(" ", "_"), {})
        batch = batch or local_generation.generate(run, 0)
        cap = Capture(run.model)
        update_policy(run.model, cap, batch.batch, batch.advantages, run.loss, run.update, run.scorer,
                      UpdateControl(torch.Generator().manual_seed(0)))
        grads[name] = cap.grads
    one, split, bf16 = grads["one pass"], grads["checkpointed micro-batches"], grads["bf16"]
    assert one.keys() == split.keys() == bf16.keys() and all("lora_" in k for k in one)
    b = [k for k in one if "lora_B" in k]
    assert b and all(float(one[k].abs().max()) > 0 for k in b)  # B = 0 at the start: only B has a gradient
    for k in one:
        assert torch.allclose(one[k], split[k], rtol=1e-4, atol=1e-8), k
    flat = lambda g: torch.cat([g[k].flatten() for k in b])  # noqa: E731
    assert torch.nn.functional.cosine_similarity(flat(one), flat(bf16), dim=0) > 0.99
