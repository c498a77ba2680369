"""The disk a sweep needs, planned at pre-flight beside memory (docs/training.md, "Disk"): for each point the
policies it keeps (the final checkpoint, ``train.save_every``'s, the best so far that ``eval.select_on=validation``
keeps with the validation inside the loop), its training state while it runs (removed when it finishes,
:func:`orchestrator.point.disk.drop_state`), and its samples (evaluation and validation). The sweep's run folders
hold every point's kept parts and one point's state at a time (the basic launcher runs the points in turn; a cluster
launcher's points may overlap: :func:`check_disk` counts every state then); the artifact store holds the samples
again. A plan that does not fit the free space is refused in one line before any work, naming what would fit.

Sizes (an estimate, upward): a policy in float32 safetensors, 4 bytes per trained parameter (with LoRA the adapter
only) and 20 MB of tokenizer and config; the training state, the policy's weights (4 bytes per parameter; with LoRA
the adapters), AdamW's two float32 moments of every trained parameter and the queued rollouts, twice while a new
state replaces the old (``train.checkpoint_every``); a sample, its response at the full ``eval.max_new_tokens``, 4
characters per token compressed about 3 times by parquet (1.5 bytes per token), plus 300 bytes of its other
columns; a benchmark without ``eval.max_prompts`` as 500 prompts (MATH-500's size; AIME's 30 make it an upper
bound)."""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from orchestrator.point.disk import human

TOKENIZER_BYTES = 20 * 2**20
SAMPLE_OVERHEAD = 300
BYTES_PER_TOKEN = 1.5  # 4 characters per token, compressed about 3x by parquet
BENCHMARK_PROMPTS = 500  # prompts per benchmark when ``eval.max_prompts`` does not bound them (MATH-500's size)


@dataclass(frozen=True)
class DiskPlan:
    """One point's disk (bytes): ``kept`` (what stays in its run folder once it finishes), ``state`` (its training
    state, while it runs), ``samples`` (its evaluation and validation samples, in its run folder and the artifact
    store), ``policy`` (one saved policy), ``kept_policies`` (how many policies ``train.save_every`` keeps), ``steps``
    (``train.steps``)."""

    kept: dict = field(default_factory=dict)
    state: float = 0.0
    samples: float = 0.0
    policy: float = 0.0
    kept_policies: int = 0
    steps: int = 0

    @property
    def run_folder(self) -> float:
        """Bytes the point's run folder holds at its fullest."""
        return sum(self.kept.values()) + self.state + self.samples


def _samples(cfg) -> float:
    """Bytes of the point's evaluation samples (the final checkpoint's, every kept one's with
    ``eval.checkpoints=all``) and validation samples (every point of the validation along training)."""
    ev = cfg.eval
    per = BYTES_PER_TOKEN * int(ev.max_new_tokens) + SAMPLE_OVERHEAD
    prompts = int(ev.get("max_prompts") or BENCHMARK_PROMPTS) * max(1, len(list(ev.get("benchmarks") or [])))
    temperatures = 1 + len(list(ev.get("extra_temperatures") or []))
    evaluations = 1
    save_every, steps = int(cfg.train.get("save_every") or 0), int(cfg.train.steps)
    if str(ev.get("checkpoints", "final")) == "all" and save_every:
        evaluations += len(range(save_every, steps, save_every))
    total = evaluations * temperatures * prompts * int(ev.n) * per
    every = int(cfg.train.get("validate_every") or 0)
    if every:
        points = len({0, steps} | set(range(every, steps, every)))
        val = int(OmegaConf.select(cfg, "data.validation_prompts") or 0) * int(ev.validation.n)
        total += points * val * per
    return float(total)


def point_plan(cfg) -> DiskPlan:
    """The disk plan of one composed point (:class:`DiskPlan`).

    Raises:
        ValueError: the model's shape is not known here (names ``model.path``).
    """
    from core.lora import LoraSettings
    from training.memory_plan import model_shape

    shape = model_shape(cfg.model)
    n, lora = shape.n_params, LoraSettings.of(cfg)
    trained = shape.lora_params(lora.rank, lora.targets()) if lora.on else n
    policy = 4.0 * trained + TOKENIZER_BYTES
    t = cfg.train
    steps, save_every = int(t.steps), int(t.get("save_every") or 0)
    kept_policies = len(range(save_every, steps, save_every)) if save_every else 0
    kept = {"final checkpoint": policy}
    if kept_policies:
        kept[f"{kept_policies} kept checkpoints (train.save_every={save_every})"] = kept_policies * policy
    if int(t.get("validate_every") or 0) and str(cfg.eval.get("select_on", "final")) == "validation":
        top = int(t.get("keep_top_k") or 1)
        kept[f"{top} selectable policies (train.keep_top_k)"] = top * policy
    queue = int(t.prompts_per_step) * int(t.group_size) * int(t.max_new_tokens) * 16.0 * (1 + int(
        OmegaConf.select(t, "rollout.staleness") or 0))
    state = 4.0 * (trained if lora.on else n) + 8.0 * trained + queue
    if int(t.get("checkpoint_every") or 0):
        state *= 2  # the new state is written beside the old before it replaces it
    return DiskPlan(kept, state, _samples(cfg), policy, kept_policies, steps)


def _free(folder: Path) -> float:
    """Free bytes on the filesystem of ``folder`` (or its nearest existing ancestor)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return float(shutil.disk_usage(folder).free)


def sweep_need(plans: list[DiskPlan], parallel: bool) -> float:
    """Bytes the sweep's run folders hold at their fullest: every point's kept parts and samples, with one state at a
    time (``parallel``: every state at once)."""
    states = [p.state for p in plans]
    return sum(sum(p.kept.values()) + p.samples for p in plans) + (sum(states) if parallel else max(states, default=0))


def advice(plans: list[DiskPlan], parallel: bool, free: float) -> str:
    """What would fit ``free`` bytes: the ``train.save_every`` that keeps few enough checkpoints, or that even
    without kept checkpoints the sweep needs more."""
    fixed = sweep_need([DiskPlan({"final checkpoint": p.kept["final checkpoint"]}, p.state, p.samples) for p in plans],
                       parallel)
    if fixed > free:
        return f"even without kept checkpoints it needs {human(fixed)}: free space, or set hydra.sweep.dir to a larger disk"
    kept = sum(p.kept_policies for p in plans)
    if not kept:
        return "free space, or set hydra.sweep.dir to a larger disk"
    per = sum(p.policy * p.kept_policies for p in plans) / kept
    room = max(int((free - fixed) // per), 0)
    keeping = [p for p in plans if p.kept_policies]
    each = room // len(keeping)  # kept checkpoints per point that fit
    steps = max(p.steps for p in keeping)
    return (f"{room} kept checkpoints fit (the sweep keeps {kept}): train.save_every={-(-steps // (each + 1))} or "
            "more, or train.save_every=0")


def check_disk(points, folder: Path, parallel: bool = False) -> str:
    """The sweep's disk plan against the free space of ``folder`` (where Hydra writes the run folders). Returns
    the plan's line (printed with the memory plans).

    Raises:
        ValueError: one line: the plan does not fit (its largest parts, the free space, what would fit).
    """
    plans = []
    for _, cfg in points:
        try:
            plans.append(point_plan(cfg))
        except ValueError:
            continue  # a model whose shape is not known here: its memory check says so
    if not plans:
        return ""
    need, free = sweep_need(plans, parallel), _free(folder)
    parts: dict = {}
    for p in plans:
        for k, v in p.kept.items():
            key = k.split(" (")[0] if not k[0].isdigit() else "kept and selectable checkpoints"
            parts[key] = parts.get(key, 0.0) + v
    parts["training state"] = max(p.state for p in plans) if not parallel else sum(p.state for p in plans)
    parts["samples"] = sum(p.samples for p in plans)
    big = ", ".join(f"{k} {human(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    line = f"disk plan: {human(need)} in {folder} for {len(plans)} point(s) ({big}); {human(free)} free"
    if need > free:
        raise ValueError(f"{line}: does not fit; {advice(plans, parallel, free)}")
    return line
