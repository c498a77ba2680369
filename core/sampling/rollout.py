"""Training rollouts from a policy held in memory (transformers or the process's vLLM engine), and the choice
between them for ``train.rollout.sampler=auto`` (the speed model)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..generation import Generation, response_mask_from_ids
from .generate import generate_responses
from .interface import SAMPLERS, SamplingSettings, resolve_sampler

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _eos_ids(model, tokenizer) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])


# ----------------------------------------------------------------------------------- training rollouts

@dataclass(frozen=True)
class RolloutOptions:
    """How a training run's rollout sampler runs (``train.rollout``): ``dtype`` of the vLLM engine (``float32`` |
    ``bfloat16`` | ``float16``) and its other ``vllm.LLM`` arguments (``gpu_memory_utilization``, ...)."""

    dtype: str = "float32"
    engine: dict = field(default_factory=dict)
    token_budget: int | None = None  # positions a transformers rollout's key/value cache may hold (train.micro_batch_tokens)


@dataclass(frozen=True)
class RolloutPlan:
    """What ``train.rollout.sampler=auto`` weighs (:func:`choose_rollout_sampler`): optimiser steps, sequences
    sampled per step (prompts x group size), the token budget of each, the policy's parameter count, whether it
    trains on a GPU, and whether this process already runs a vLLM engine that would serve the run."""

    steps: int
    sequences: int
    max_new_tokens: int
    n_params: int
    gpu: bool = False
    engine_ready: bool = False

    @property
    def tokens(self) -> int:
        return self.steps * self.sequences * self.max_new_tokens


#: Sampling speeds of a training run's rollouts for a 100M-parameter model, in token budget per second (sequences x
#: max_new_tokens over the generation's wall time; speeds scale as 1 / parameters), and vLLM's start in the training
#: process (import and engine, seconds). CPU: measured on 2 cores (Xeon with AMX), SmolLM2-135M, float32, 4 prompts x
#: 8 x 48 tokens (``python -m benchmarks.train_step``, dated on docs/performance.md: generation 9.95 s with hf, 6.92 s with vLLM per
#: step; the engine's start about 11 s). GPU: not measured here (no GPU was lent); vLLM's usual order of magnitude
#: over transformers ``generate``, and a start of a minute.
ROLLOUT_SPEED = {"cpu": {"hf": 208.0, "vllm": 300.0, "vllm_start_s": 11.0},
                 "gpu": {"hf": 1500.0, "vllm": 15000.0, "vllm_start_s": 60.0}}


#: where each machine's measured-to-estimated sampling times are kept (``RLVR_ROLLOUT_CALIBRATION``: another file, or
#: ``off``: the constants alone, as the tests run)
CALIBRATION_ENV = "RLVR_ROLLOUT_CALIBRATION"
CALIBRATION_KEEP = 5  # the last runs' ratios a machine's factor is the median of


def _calibration_file():
    from pathlib import Path

    where = os.environ.get(CALIBRATION_ENV, "")
    if where.strip().lower() == "off":
        return None
    return Path(where) if where else Path.home() / ".cache" / "rlvr-suite" / "rollout_speed.json"


def _machine(gpu: bool) -> str:
    from ..precision import cpu_name

    if gpu and torch.cuda.is_available():
        return f"gpu:{torch.cuda.get_device_name()}"
    return f"{'gpu' if gpu else 'cpu'}:{cpu_name()}:{os.cpu_count()} cores"


def calibration_factor(sampler: str, gpu: bool) -> float:
    """How many times its estimate a sampler's sampling took on this machine: the median of the last
    :data:`CALIBRATION_KEEP` runs' measured / estimated (:func:`record_sampling_time`), 1.0 when none was recorded
    (or ``RLVR_ROLLOUT_CALIBRATION=off``)."""
    import json

    path = _calibration_file()
    try:
        ratios = json.loads(path.read_text()).get(f"{_machine(gpu)}|{sampler}", []) if path else []
    except (OSError, ValueError, AttributeError):
        ratios = []
    ratios = sorted(float(r) for r in ratios if isinstance(r, (int, float)) and r > 0)
    if not ratios:
        return 1.0
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


BUSY_LOAD = 1.5  # load average per core above which a measured time says more about other work than the sampler


def record_sampling_time(sampler: str, gpu: bool, estimate_s: float, measured_s: float,
                         load_per_core: float | None = None) -> bool:
    """Keep a run's measured / estimated sampling time (``estimate_s`` before calibration) for this machine, so the
    next ``auto`` choice here weighs the samplers by what they took (:func:`calibration_factor`: the median of the
    last runs'); not when the machine was busy with other work (``load_per_core``, the 1-minute load average over the
    cores as the run ended, above :data:`BUSY_LOAD`; on the CPU only). Returns whether it was kept; never raises."""
    import json

    path = _calibration_file()
    if path is None or not estimate_s or estimate_s <= 0 or not measured_s or measured_s <= 0:
        return False
    if not gpu and load_per_core is not None and load_per_core > BUSY_LOAD:
        return False
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
        key = f"{_machine(gpu)}|{sampler}"
        data[key] = (list(data.get(key, [])) + [round(float(measured_s) / float(estimate_s), 4)])[-CALIBRATION_KEEP:]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
        return True
    except (OSError, ValueError, TypeError):
        return False


def _speed(what: str, plan: RolloutPlan) -> float:
    value = ROLLOUT_SPEED["gpu" if plan.gpu else "cpu"][what]
    return value if what.endswith("_s") else value * 1e8 / max(plan.n_params, 1)


def choose_rollout_sampler(name: str, plan: RolloutPlan) -> tuple[str, str]:
    """The rollout sampler of a training run and why: ``name`` itself when it is not ``auto`` (after checking it can
    run here), else the registered sampler with the lowest estimated sampling time for ``plan`` (each sampler's
    ``rollout_cost``; vLLM's includes its start unless this process's engine already serves the run).

    Raises:
        ValueError: an unknown sampler, one that cannot run here, or one that cannot roll out a policy.
    """
    if name != "auto":
        resolved = resolve_sampler(name)
        if SAMPLERS[resolved].rollout is None:
            raise ValueError(f"train.rollout.sampler={name!r}: this sampler cannot sample a policy in training")
        return resolved, "asked for"
    costs = {spec.name: float(spec.rollout_cost(plan)) * calibration_factor(spec.name, plan.gpu)
             for spec in SAMPLERS.values()
             if spec.rollout is not None and spec.rollout_cost is not None and spec.missing() is None}
    best = min(costs, key=costs.get)
    shown = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(costs.items(), key=lambda kv: kv[1]))
    factors = {k: calibration_factor(k, plan.gpu) for k in costs}
    calibrated = ", ".join(f"{k} x{f:.2g}" for k, f in factors.items() if f != 1.0)
    return best, (f"auto: estimated sampling time for {plan.steps} steps x {plan.sequences} sequences x "
                  f"{plan.max_new_tokens} tokens ({plan.n_params / 1e6:.0f}M parameters, "
                  f"{'GPU' if plan.gpu else 'CPU'}): {shown}"
                  + (f" (calibrated by this machine's earlier runs: {calibrated})" if calibrated else ""))


def rollout_estimate_s(name: str, plan: RolloutPlan) -> float | None:
    """Sampler ``name``'s estimated sampling time for ``plan`` in seconds before this machine's calibration (its
    ``rollout_cost``; ``auto`` weighs it by :func:`calibration_factor`), None when it has no estimate. The run records
    it beside the time its generation took (the engine's :class:`training.engines.RolloutChoice`; :func:`record_sampling_time`)."""
    spec = SAMPLERS.get(name)
    cost = None if spec is None or spec.rollout_cost is None else spec.rollout_cost(plan)
    return None if cost is None else float(cost)


def build_rollout(name: str, model, tokenizer, model_path, options: RolloutOptions | None = None):
    """The training rollout sampler ``name`` (resolved, not ``auto``) for the policy ``model``."""
    return SAMPLERS[name].rollout(model, tokenizer, model_path, options or RolloutOptions())


class HFRollout:
    """Training rollouts with transformers ``generate`` on the policy itself: nothing to copy or sync; no log-probs of
    its own (the trainer's old log-probs are the rollout policy's)."""

    name = "hf"

    def __init__(self, model, tokenizer, token_budget: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.sync_s = 0.0
        self.token_budget = token_budget

    def generate(self, texts: Sequence[str], n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> Generation:
        """``n`` samples per text; with a token budget the prompts go in groups whose key/value cache (rows x
        (longest prompt + ``max_new_tokens``) positions) fits it, group k seeded ``seed + k`` (one group, the whole
        call: the same samples as without a budget)."""
        chunks = _budget_chunks(self.tokenizer, texts, n, max_new_tokens, self.token_budget)
        settings = SamplingSettings(temperature, top_p, max_new_tokens)
        gens = [generate_responses(self.model, self.tokenizer, [texts[i] for i in idx], n, settings, seed + k)
                for k, idx in enumerate(chunks)]
        return gens[0] if len(gens) == 1 else concat_generations(gens, self.tokenizer.pad_token_id)

    def generate_with_tools(self, texts, n: int, settings: SamplingSettings, seed: int, use) -> Generation:
        """``n`` multi-turn episodes per text (:func:`core.agent.generate_with_tools`; ``use``: a
        :class:`core.agent.ToolUse`)."""
        from ..agent import generate_with_tools

        return generate_with_tools(self.model, self.tokenizer, texts, n, settings, seed, use)

    def sync(self, model) -> float:
        return 0.0

    def sleep(self) -> None:
        return None

    def close(self) -> None:
        self.model = None


class RolloutSampler:
    """The evaluation's sampler protocol (:class:`core.sampling.Sampler`) over a training run's rollout sampler
    (:class:`HFRollout` or :class:`VLLMRollout`, holding the policy as it is now): the validation inside the training
    loop samples with it, so it costs no second copy of the model and runs at the training's precision.

    Each call is one ``generate`` of the rollout (with ``tools``: its multi-turn episodes, ``generate_with_tools``),
    seeded with the call's first prompt's seed (as the ``hf`` sampler seeds a batch: the same chunks with the same
    seeds give the same samples); the samples carry no entropy
    (``entropy_method`` None). ``precision``: the dtype the rollout samples in (recorded with the validation
    protocol). ``close()`` leaves the rollout open: it belongs to the training run."""

    preferred_batch_prompts = 8
    supports_tools = True
    entropy_method = None

    def __init__(self, rollout, tokenizer, precision: str = "float32"):
        import collections

        self.rollout, self.tokenizer, self.precision = rollout, tokenizer, str(precision)
        self.name = f"rollout:{rollout.name}"
        self.timings: collections.Counter = collections.Counter()

    def sample(self, prompts: Sequence[str], n: int, seeds: Sequence[int], settings: SamplingSettings,
               tools: dict | None = None, max_turns: int = 4, max_obs_tokens: int = 256,
               prefixes: Sequence[str] | None = None) -> list[list]:
        """``n`` samples per prompt (rendered as training renders them, :func:`core.sampling.prompt_texts`), as
        :class:`core.sampling.Sample` records, prompt by prompt; with ``tools`` ({name: core.tools.Tool}) multi-turn
        episodes with those tools and limits (:class:`core.agent.ToolUse`), each sample carrying ``tool_calls``."""
        from .generate import prompt_texts
        from .interface import Sample

        texts = prompt_texts(self.tokenizer, prompts, settings.chat_template)
        if prefixes:
            texts = [t + (p or "") for t, p in zip(texts, prefixes)]
        seed = int(seeds[0])
        if tools:
            from ..agent import ToolUse

            gen = self.rollout.generate_with_tools(texts, int(n), settings, seed, ToolUse(tools, max_turns, max_obs_tokens))
        else:
            gen = self.rollout.generate(texts, int(n), float(settings.temperature), float(settings.top_p),
                                        int(settings.max_new_tokens), seed)
        calls = gen.tool_calls
        return [[Sample(gen.texts[j], int(gen.response_lengths[j]), "stop" if bool(gen.finished[j]) else "length",
                        None, seed, None if calls is None else int(calls[j])) for j in range(i * n, (i + 1) * n)]
                for i in range(len(prompts))]

    def close(self) -> None:
        return None


def _budget_chunks(tokenizer, texts: Sequence[str], n: int, max_new_tokens: int, budget: int | None) -> list[list[int]]:
    """Consecutive groups of prompt indices whose generation holds at most ``budget`` positions (each group's rows x
    (its longest prompt + ``max_new_tokens``)); one group of all without a budget. A prompt that alone exceeds the
    budget goes alone."""
    if budget is None or not texts:
        return [list(range(len(texts)))]
    lengths = [len(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    out, cur, longest = [], [], 0
    for i, p in enumerate(lengths):
        wide = max(longest, p)
        if cur and (len(cur) + 1) * n * (wide + max_new_tokens) > int(budget):
            out.append(cur)
            cur, wide = [], p
        cur.append(i)
        longest = wide
    out.append(cur)
    return out


def concat_generations(gens: list["Generation"], pad_id: int) -> "Generation":
    """One :class:`Generation` of several (rows in order): prompts re-padded on the left, responses on the right."""
    import dataclasses

    P = max(g.prompt_ids.shape[1] for g in gens)
    L = max(g.response_ids.shape[1] for g in gens)

    def left(t, value):
        return torch.cat([t.new_full((t.shape[0], P - t.shape[1]), value), t], dim=1)

    def right(t, value):
        return torch.cat([t, t.new_full((t.shape[0], L - t.shape[1]), value)], dim=1)

    out = {"prompt_ids": torch.cat([left(g.prompt_ids, pad_id) for g in gens]),
           "prompt_mask": torch.cat([left(g.prompt_mask, 0) for g in gens]),
           "response_ids": torch.cat([right(g.response_ids, pad_id) for g in gens]),
           "response_mask": torch.cat([right(g.response_mask, 0) for g in gens]),
           "texts": [t for g in gens for t in g.texts]}
    for f in dataclasses.fields(gens[0]):
        if f.name in out:
            continue
        vals = [getattr(g, f.name) for g in gens]
        if all(v is None for v in vals):
            out[f.name] = None
        elif isinstance(vals[0], torch.Tensor):
            out[f.name] = torch.cat([right(v, 0) if v.dim() == 2 else v for v in vals])
        elif isinstance(vals[0], list):
            out[f.name] = [x for v in vals for x in v]
        else:
            out[f.name] = vals[0]
    return dataclasses.replace(gens[0], **out)


class VLLMRollout:
    """Training rollouts through the process's vLLM engine (:mod:`core.vllm_engine`), which takes the policy's
    weights in place after every optimiser step (:meth:`sync`). Each generation also returns vLLM's log-prob of each
    sampled token at the sampling temperature (``Generation.logprobs``), for the trainer to measure, and optionally
    correct, the training-inference mismatch.

    Seeds: prompt i of a call is one request seeded from (``seed``, i), its n samples vLLM's draws of that request; in
    multi-turn episodes each episode's turn is its own request, seeded from (``seed``, episode, turn)."""

    name = "vllm"

    def __init__(self, engine, tokenizer, eos_ids: Sequence[int]):
        self.engine, self.tokenizer, self.eos_ids = engine, tokenizer, list(eos_ids)
        self.version = 0
        self.sync_s = 0.0

    def _params(self, n, temperature, top_p, max_tokens, seed, **extra):
        from vllm import SamplingParams

        greedy = float(temperature) == 0.0
        return SamplingParams(n=1 if greedy else int(n), seed=int(seed) % (2**31), temperature=float(temperature),
                              top_p=1.0 if greedy else float(top_p), max_tokens=int(max_tokens), logprobs=0, stop_token_ids=self.eos_ids, detokenize=False,
                              **extra)

    @staticmethod
    def _token_logprobs(c) -> list[float]:
        return [float(d[t].logprob) if d and t in d else 0.0 for t, d in zip(c.token_ids, c.logprobs or [])]

    def requests(self, texts: Sequence[str], n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> tuple[list[list[int]], list]:
        """The engine requests :meth:`generate` makes: each text's token ids and its ``SamplingParams`` (``n``
        samples, seeded from (``seed``, i), the sampled token's log-prob, no detokenisation, stop at EOS)."""
        ids = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
        return ids, [self._params(n, temperature, top_p, max_new_tokens, seed * 1_000_003 + i * 10_007)
                     for i in range(len(ids))]

    def generate(self, texts: Sequence[str], n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> Generation:
        """``n`` samples per text, as :func:`generate_responses` lays them out (prompt-major, left-padded prompts,
        right-padded responses, the mask through the first EOS), with ``logprobs`` (B, L)."""
        self.engine.wake_up()
        ids, params = self.requests(texts, n, temperature, top_p, max_new_tokens, seed)
        outs = self.engine.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        greedy = float(temperature) == 0.0
        rows, lps = [], []
        for res in outs:
            cs = list(res.outputs) * int(n) if greedy else list(res.outputs)
            rows += [list(c.token_ids) or [self.tokenizer.pad_token_id] for c in cs]
            lps += [self._token_logprobs(c) for c in cs]
        return _generation(self.tokenizer, ids, int(n), rows, lps, self.eos_ids)

    def generate_with_tools(self, texts, n: int, settings: SamplingSettings, seed: int, use) -> Generation:
        """Multi-turn episodes (:func:`core.agent.run_episodes`; ``use``: a :class:`core.agent.ToolUse`) on the
        engine: each turn of each episode one request that stops at a tool's closing tag, ``</answer>`` or EOS,
        seeded by (``seed``, episode, turn)."""
        from ..agent import ANSWER_CLOSE, run_episodes

        self.engine.wake_up()
        stops = [t.close_tag for t in use.tools.values()] + [ANSWER_CLOSE]
        temperature, top_p = settings.temperature, settings.top_p

        def cont(seqs, budgets, turn):
            params = [self._params(1, temperature, top_p, b, seed * 7919 + turn * 100_003 + j, stop=stops,
                                   include_stop_str_in_output=True) for j, b in enumerate(budgets)]
            outs = self.engine.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
            return [(list(o.outputs[0].token_ids), self._token_logprobs(o.outputs[0])) for o in outs]

        return run_episodes(cont, self.tokenizer, self.eos_ids, texts, n, settings.max_new_tokens, use)

    def sync(self, model) -> float:
        """Load ``model``'s current weights into the engine in place (after an optimiser step). Returns seconds."""
        self.version += 1
        self.sync_s = self.engine.load_module(model, f"policy:{id(model)}:{self.version}")
        return self.sync_s

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer updates the policy (a no-op on the CPU)."""
        self.engine.sleep()

    def close(self) -> None:
        self.engine.sleep()


def _generation(tokenizer, prompt_ids: list[list[int]], n: int, responses: list[list[int]], logprobs: list[list[float]],
                eos_ids: Sequence[int]) -> Generation:
    """A :class:`Generation` from token lists: prompts (one per n rows) left-padded, responses right-padded."""
    pad = tokenizer.pad_token_id
    B = len(responses)
    p_width = max(len(p) for p in prompt_ids)
    prompts = [prompt_ids[i // n] for i in range(B)]
    width = max(1, max(len(r) for r in responses))
    response_ids = torch.tensor([r + [pad] * (width - len(r)) for r in responses])
    mask, finished = response_mask_from_ids(response_ids, eos_ids)
    lp = torch.tensor([x + [0.0] * (width - len(x)) for x in logprobs]) * mask
    texts = tokenizer.batch_decode(response_ids.masked_fill(mask == 0, pad), skip_special_tokens=True)
    return Generation(
        prompt_ids=torch.tensor([[pad] * (p_width - len(p)) + p for p in prompts]),
        prompt_mask=torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts]),
        response_ids=response_ids, response_mask=mask, response_lengths=mask.sum(-1), finished=finished, texts=texts,
        logprobs=lp)
