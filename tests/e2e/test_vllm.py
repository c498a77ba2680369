"""Sweep points evaluated by the real vLLM engine (its CPU build in CI), and `python -m orchestrator.evaluate
--sampler vllm`.

The points are those of the all-algorithms sweep (tests/e2e/conftest.py: rollouts and evaluations on one vLLM engine
for the whole sweep process). Its base model is evaluated once inside the sweep and once more by the CLI in another
process: same model, same seeds, so the two sample tables must be identical.
"""
import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from core.sampling import SAMPLERS
from tests.conftest import REPO as REPO_ROOT
from tests.e2e.conftest import EVAL
from tests.e2e.test_sweep import _runs
from tests.prewarmed import python

pytestmark = pytest.mark.skipif(SAMPLERS["vllm"].missing() is not None,
                                reason="vLLM is not installed (scripts/install.sh installs its CPU build)")
COLUMNS = ["benchmark", "prompt_id", "sample_idx", "prompt", "gold", "response", "n_tokens", "finish_reason",
           "extracted_answer", "correct", "reference_correct", "mean_token_entropy", "seed", "subset", "tool_calls",
           "answer_status"]
N, PROMPTS = 2, 2  # the sweep's eval.n and eval.max_prompts (EVAL)


@pytest.fixture(scope="module")
def vllm_sweep(all_algos_dir):
    cwd, _ = all_algos_dir
    client, runs = _runs(cwd)
    base = [r for r in runs if r.data.tags["rlvr.kind"] == "base"]
    trained = {r.data.params["algo.name"]: r for r in runs if r.data.tags["rlvr.kind"] == "trained"}
    assert len(base) == 1 and len(trained) == 14
    return cwd, client, base[0], trained


def _download(client, run, tmp_path, name="samples.parquet"):
    return pd.read_parquet(client.download_artifacts(run.info.run_id, name, str(tmp_path / run.info.run_id)))


def test_sweep_points_sampled_by_vllm_log_every_table(vllm_sweep, tmp_path):
    _, client, base, trained = vllm_sweep
    assert all(r.info.status == "FINISHED" and r.data.tags["rlvr.sampler"] == "vllm" for r in [base, *trained.values()])
    for run in (base, trained["grpo"], trained["quatro"]):
        assert run.data.tags["rlvr.entropy_method"].startswith("exact: full next-token distribution at the sampling "
                                                               "temperature, from the float32 logits vLLM sampled from")
        df = _download(client, run, tmp_path)
        assert list(df.columns) == COLUMNS
        per_prompt = df.groupby("prompt_id").size()
        assert len(per_prompt) == PROMPTS and (per_prompt == N).all()
        assert set(df["finish_reason"]) <= {"stop", "length"}
        assert df["n_tokens"].between(1, 8).all() and (df.loc[df["finish_reason"] == "length", "n_tokens"] == 8).all()
        # the tiny random model's next-token distribution is almost uniform over its 49,152 tokens
        assert df["mean_token_entropy"].notna().all()
        assert df["mean_token_entropy"].between(0.9 * math.log(49152), math.log(49152)).all()
        assert df.groupby("prompt_id")["seed"].nunique().eq(1).all()  # one seeded request per prompt
        m = run.data.metrics
        for key in ("pass_at_1", f"pass_at_{N}", f"avg_at_{N}", f"ucc_at_{N}", "ucr", "entropy", "effective_yield"):
            assert f"eval/arithmetic/{key}" in m and f"eval/mean/{key}" in m, key
    for run in trained.values():
        assert run.data.tags["rlvr.base_run_id"] == base.info.run_id
    grpo = trained["grpo"]
    assert "eval/arithmetic/flip/very_hard/solved_from_unsolved" in grpo.data.metrics
    assert "flip_rates.csv" in {a.path for a in client.list_artifacts(grpo.info.run_id)}


def test_cli_vllm_on_the_base_model_reproduces_the_sweeps_base_samples(vllm_sweep, tmp_path, tiny_cfg):
    from core.models import model_path

    cwd, client, base, _ = vllm_sweep
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    overrides = [o.removeprefix("eval.") for o in EVAL]
    proc = subprocess.run([*python(), "-m", "orchestrator.evaluate", "--checkpoint", model_path(tiny_cfg.model),
                           "--eval", "smoke", "--sampler", "vllm", "--out", str(tmp_path / "cli"), *overrides],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = pd.read_parquet(tmp_path / "cli" / "samples.parquet")
    sweep = _download(client, base, tmp_path)
    key = ["benchmark", "prompt_id", "sample_idx"]
    cli, sweep = cli.sort_values(key).reset_index(drop=True), sweep.sort_values(key).reset_index(drop=True)
    same = ["prompt_id", "sample_idx", "response", "n_tokens", "finish_reason", "seed", "correct"]
    pd.testing.assert_frame_equal(cli[same], sweep[same])  # two engines, same seeds: the same samples
    assert cli["mean_token_entropy"].to_numpy() == pytest.approx(sweep["mean_token_entropy"].to_numpy(), rel=1e-6)
    assert len(cli) == N * PROMPTS and cli["response"].nunique() == len(cli)  # and they are real, distinct samples


SYNC = """
import json, os, sys
import torch
from omegaconf import OmegaConf
from core import vllm_engine
from core.models import load_policy, model_path
from core.sampling import RolloutOptions, SamplingSettings, VLLMSampler, build_rollout, generate_responses, prompt_texts
from core.scoring import Sequences, compute_logprobs
cfg = OmegaConf.create(json.loads(sys.argv[1]))
# the evaluation sampler first: greedy decoding with two other seeds
before = (torch.set_num_threads, torch.get_num_threads(), os.sched_getaffinity(0))
smp = VLLMSampler(model_path(cfg), with_entropy=True)
s = SamplingSettings(0.0, 0.5, 8)
runs = [smp.sample(["Compute 1 + 1.", "Compute 20 + 22. Answer with just the number."], 3, [seed, seed + 1], s)
        for seed in (1, 99)]
smp.close()
engine = vllm_engine.current_engine()
restored = (torch.set_num_threads, torch.get_num_threads(), os.sched_getaffinity(0)) == before
print("RESTORED", restored, "IN_PROCESS", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"))
print("GREEDY " + json.dumps([[[[x["response"], x["n_tokens"], x["mean_token_entropy"]] for x in g] for g in r] for r in runs]))
# entropies recorded inside vLLM while it samples, against the teacher-forced transformers pass over the same samples
# (the same engine and seeds without the recorder: a sampler wrapping the engine's LLM directly)
s1 = SamplingSettings(1.0, 1.0, 8)
prompts = ["Compute 1 + 1.", "Compute 20 + 22.", "Name a prime number."]
rec = VLLMSampler(model_path(cfg), with_entropy=True)
recorded = rec.sample(prompts, 4, [5, 6, 7], s1)
method = rec.entropy_method
forced = VLLMSampler(model_path(cfg), llm=engine.llm, with_entropy=True).sample(prompts, 4, [5, 6, 7], s1)
print("ENTROPY " + json.dumps([method, [[x["response"], x["mean_token_entropy"]] for g in recorded for x in g],
                                [[x["response"], x["mean_token_entropy"]] for g in forced for x in g]]))
# the reproduce promise (issue 59): a prompt's samples depend on its own seed only, not on the batch around it
comp = VLLMSampler(model_path(cfg), llm=engine.llm, with_entropy=False)
alone = [comp.sample([p], 4, [sd], s1)[0] for p, sd in zip(prompts, [5, 6, 7])]
mixed = comp.sample([prompts[2], "Say hi.", prompts[0], prompts[1], "Count to three."], 4, [7, 11, 5, 6, 12], s1)
other = comp.sample(prompts, 4, [8, 9, 10], s1)
resp = lambda groups: [[x["response"] for x in g] for g in groups]
print("COMPOSITION " + json.dumps([resp(recorded), resp(alone), resp([mixed[2], mixed[3], mixed[0]]), resp(other)]))
# the evaluation seed reaches vLLM through the evaluation's path (eval.seed -> each prompt's seed -> its request)
import tempfile
from pathlib import Path
from evaluation.pipeline import Draw, sample_benchmarks
rows = {"arithmetic": [{"id": "a", "prompt": "Compute 3 + 4.", "gold": "7", "task": "arithmetic"},
                       {"id": "b", "prompt": "Compute 12 + 30.", "gold": "42", "task": "arithmetic"}]}
tmp = Path(tempfile.mkdtemp())
evals = []
for i, seed in enumerate((0, 0, 1)):
    (tmp / str(i)).mkdir()
    df = sample_benchmarks(comp, rows, Draw(4, seed, 4, s1), tmp / str(i) / "samples.parquet")
    evals.append(df.sort_values(["prompt_id", "sample_idx"])["response"].tolist())
print("EVAL_SEED " + json.dumps([evals[0] == evals[1], evals[0] != evals[2], len(evals[0])]))
# then training rollouts from a policy in memory, on the same engine
model, tok = load_policy(cfg)
texts = prompt_texts(tok, ["Compute 1 + 1.", "Compute 20 + 22.", "Name a prime number."], True)
rollout = build_rollout("vllm", model, tok, model_path(cfg), RolloutOptions(dtype="float32"))
print("SAME_ENGINE", rollout.engine is engine)
# the rollout's requests are seeded from (call seed, position): the first prompt's samples whatever follows it
first = [rollout.generate(texts[:1] + extra, 3, 1.0, 1.0, 8, seed=4).response_ids[:3].tolist()
         for extra in ([], texts[1:], texts[2:] * 3)]
print("ROLLOUT_COMPOSITION", all(f == first[0] for f in first))
enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def follow(model, rollout, opt):
    # three rounds: greedy continuations from transformers and from the engine, then an optimiser step towards
    # other random continuations (the argmax moves) and the engine's sync
    out = []
    for step in range(3):
        if step:
            model.train()
            target = torch.randint(1000, 20000, (len(texts), 8), generator=torch.Generator().manual_seed(step))
            ids = torch.cat([enc.input_ids, target], 1)
            logits = model(input_ids=ids, attention_mask=torch.cat([enc.attention_mask, torch.ones_like(target)], 1)).logits
            loss = -torch.nn.functional.log_softmax(logits[:, -9:-1], -1).gather(-1, target[..., None]).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            rollout.sync(model)
        model.eval()
        hf = generate_responses(model, tok, texts, 1, SamplingSettings(0.0, 1.0, 8))
        vl = rollout.generate(texts, 1, 0.0, 1.0, 8, seed=step)
        with torch.no_grad():
            lp, _ = compute_logprobs(model, Sequences.of(hf), 1.0)
        def rows(g):
            return [r[: int(k)] for r, k in zip(g.response_ids.tolist(), g.response_mask.sum(-1).tolist())]
        diff = [abs(a - b) for i, r in enumerate(rows(vl)) for j, (a, b) in
                enumerate(zip(lp[i].tolist(), vl.logprobs[i].tolist())) if j < len(r)]
        out.append({"hf": rows(hf), "vllm": rows(vl), "max_lp_diff": max(diff)})
    return out


out = follow(model, rollout, torch.optim.AdamW(model.parameters(), lr=1e-2))
# a LoRA policy on the same engine (which now holds the fully trained weights above): after each sync it holds the
# base with the current adapters merged; the base stays bit-identical; with the adapters disabled it is the base
from core.lora import LoraSettings, attach, reference
base, _ = load_policy(cfg)
lora, _ = load_policy(cfg)
attach(lora, LoraSettings(rank=4, alpha=8))
lrollout = build_rollout("vllm", lora, tok, model_path(cfg), RolloutOptions(dtype="float32"))
lout = follow(lora, lrollout, torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=5e-2))
names = {k.replace(".base_layer", ""): v for k, v in lora.state_dict().items() if "lora_" not in k}
frozen = sorted(names) == sorted(base.state_dict()) and all(torch.equal(names[k], v) for k, v in base.state_dict().items())
g = generate_responses(base, tok, texts, 2, SamplingSettings(1.0, 1.0, 8), seed=3)
with torch.no_grad():
    own, _ = compute_logprobs(base, Sequences.of(g), 1.0)
    adapted, _ = compute_logprobs(lora, Sequences.of(g), 1.0)
    with reference(lora):
        ref, _ = compute_logprobs(lora, Sequences.of(g), 1.0)
m = g.response_mask.bool()
print("LORA " + json.dumps({"steps": lout, "frozen": frozen, "ref_diff": float((ref - own)[m].abs().max()),
                            "adapted_diff": float((adapted - own)[m].abs().max())}))
print("RESULT " + json.dumps(out))
"""


def test_vllm_greedy_then_rollout_weights_follow_the_policy_after_each_optimiser_step(tiny_cfg):
    """One process, one vLLM engine. First the evaluation sampler, eval.temperature=0: two calls with other seeds give
    the same sequences, and the n samples of a prompt are that one sequence (vLLM is asked for one per prompt); the
    in-process engine leaves this process's torch thread settings as they were. At temperature 1 the entropies vLLM's
    engine records while sampling equal the teacher-forced transformers pass over the same samples to 1e-4 (each
    response's mean over its tokens). Then the training rollout sampler
    reuses that engine and takes the policy's weights in place after each optimiser step: its greedy continuations
    equal transformers' on the updated policy token for token (float32), its log-probs of those tokens agree to
    1e-4, and the updates (AdamW, lr 1e-2) changed the argmax somewhere, so a stale engine would fail. The same for a
    LoRA policy on that engine (merged weights pushed after each step). The reproduce promise (issue 59): a prompt's
    samples do not depend on the batch around it, for the evaluation sampler and the training rollout; through the
    evaluation's path, the same eval.seed draws the same samples from vLLM and another seed other ones (issue 60)."""
    import json

    import torch
    from omegaconf import OmegaConf

    proc = subprocess.run([sys.executable, "-c", SYNC, json.dumps(OmegaConf.to_container(tiny_cfg.model, resolve=True))],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # on the CPU the engine core ran in this process (one import of vLLM, not two) and the engine put back the torch
    # thread settings vLLM's CPU worker replaces (torch.set_num_threads becomes a no-op there)
    assert ("RESTORED True" + ("" if torch.cuda.is_available() else " IN_PROCESS 0")) in proc.stdout, proc.stdout[-2000:]
    a, b = json.loads(proc.stdout.split("GREEDY ", 1)[1].splitlines()[0])
    assert a == b
    for group in a:
        assert len(group) == 3 and all(x == group[0] for x in group) and 1 <= group[0][1] <= 8
    assert "SAME_ENGINE True" in proc.stdout
    # the reproduce promise: each prompt's samples the same alone, in a batch of three and mixed into a batch of five
    # with other prompts in another order (its seed travels with it); other seeds give other samples
    batch3, alone, mixed, other = json.loads(proc.stdout.split("COMPOSITION ", 1)[1].splitlines()[0])
    assert alone == batch3 and mixed == batch3 and other != batch3
    assert "ROLLOUT_COMPOSITION True" in proc.stdout
    assert json.loads(proc.stdout.split("EVAL_SEED ", 1)[1].splitlines()[0]) == [True, True, 8]  # eval.seed reaches vLLM
    method, recorded, forced = json.loads(proc.stdout.split("ENTROPY ", 1)[1].splitlines()[0])
    assert method.endswith("vLLM sampled from (a logits processor; no second pass)")
    assert [r for r, _ in recorded] == [r for r, _ in forced] and len(recorded) == 12  # the same samples
    assert [h for _, h in recorded] == pytest.approx([h for _, h in forced], abs=1e-4)
    steps = json.loads(proc.stdout.split("RESULT ", 1)[1])
    for s in steps:
        assert s["vllm"] == s["hf"] and all(s["hf"])
        assert s["max_lp_diff"] < 1e-4
    assert steps[1]["hf"] != steps[0]["hf"] and steps[2]["hf"] != steps[1]["hf"]
    # LoRA (train.lora): the engine takes the base with the current adapters merged after each optimiser step, so
    # its greedy continuations follow the adapted policy token for token and its log-probs agree to 1e-4; the base
    # weights are bit-identical after the steps, and with the adapters disabled the policy scores as a separately
    # loaded base model (the KL term's reference, no copy) while the adapted policy does not
    lora = json.loads(proc.stdout.split("LORA ", 1)[1].splitlines()[0])
    for s in lora["steps"]:
        assert s["vllm"] == s["hf"] and all(s["hf"])
        assert s["max_lp_diff"] < 1e-4
    assert lora["steps"][1]["hf"] != lora["steps"][0]["hf"] and lora["steps"][2]["hf"] != lora["steps"][1]["hf"]
    assert lora["frozen"] is True
    assert lora["ref_diff"] < 1e-6 and lora["adapted_diff"] > 1e-2


LIBRARY_SIGNS = ("(MainProcess pid=", "Attempted to load weight", "[vllm", "Triton", "Loading weights",
                 "Writing model shards", "FutureWarning", "UserWarning", "[transformers", "[py.warnings]", "[mlflow",
                 "INFO  [alembic")


def test_the_console_is_the_suites_and_the_libraries_output_is_in_the_point_logs(vllm_sweep, all_algos_dir):
    """Issue 56: the README's main job printed 848 lines, 732 of them vLLM's per-tensor dtype warnings. On this
    sweep (one vLLM engine for rollouts and evaluations, 14 points): no library line on the screen; the libraries'
    lines in the points' ``sweep.log`` files, which their MLflow runs keep; no per-tensor dtype warning anywhere
    (weights reach the engine in its dtype)."""
    cwd, client, base, trained = vllm_sweep
    _, proc = all_algos_dir
    screen = proc.stdout + proc.stderr
    assert not [s for s in LIBRARY_SIGNS if s in screen], [ln for ln in screen.splitlines()
                                                           if any(s in ln for s in LIBRARY_SIGNS)][:5]
    logs = "".join(p.read_text() for p in cwd.glob("multirun/*/*/*/sweep.log"))
    assert "[vllm" in logs  # the engine's own lines, off the screen but kept
    assert "Attempted to load weight" not in logs
    for run in trained.values():
        assert "sweep.log" in {a.path for a in client.list_artifacts(run.info.run_id)}
