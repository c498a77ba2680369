"""Every paper preset's memory plan on one GPU and its disk plan: the table of docs/training.md.

    python -m orchestrator.memory [--device-gb 80]

For each preset of ``sweeps/experiment/`` (not the CPU twins), its points composed as the sweep would, each point's
plan (:func:`training.memory_plan.plan_for`) on one GPU of ``--device-gb`` with ``train.micro_batch_tokens=auto``:
the largest point's, and whether it fits as the preset is, fits with other settings (which), or needs verl on several
GPUs (how many); and the disk the sweep's run folders hold at their fullest (every point's kept policies and
samples, one training state at a time, validation and overlap as the preset sets them:
:mod:`orchestrator.checks.disk_plan`). Nothing is downloaded: the presets' model shapes ship with the suite.
"""
from __future__ import annotations

import argparse
import functools
import sys

from orchestrator.checks.preflight import CONFIG_DIR, sweep_points

SKIP = ("cpu_study", "verl_smoke")
#: presets whose largest model has at least this many billion parameters get a ``lora=on`` row (sweeps/lora/on.yaml)
LORA_FROM_B = 6.5


def paper_presets() -> list[str]:
    """The paper presets (``sweeps/experiment/*.yaml`` but the CPU twins and the CPU demonstrations)."""
    return sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml")
                  if not p.stem.endswith("_cpu") and p.stem not in SKIP)


@functools.lru_cache(maxsize=64)
def _points(name: str) -> tuple:
    """The composed points of preset ``name``'s sweep (cached: composing is most of the table's time)."""
    return tuple(sweep_points([f"experiment={name}"]))


def _lora_on():
    """``sweeps/lora/on.yaml`` (a ``_global_`` package: it sets ``train.*`` keys only), to merge into composed points
    as ``lora=on`` would (composing every preset again takes most of a minute)."""
    from omegaconf import OmegaConf

    return OmegaConf.load(CONFIG_DIR / "lora" / "on.yaml")


def preset_plan(name: str, device_gb: float = 80.0, lora: bool = False) -> dict:
    """The plan of preset ``name``'s most demanding point (with ``lora``: its ``lora=on`` variant) on one GPU of
    ``device_gb`` GiB.

    Returns:
        {"preset", "engine", "model", "params_b", "points", "total_gb", "static_gb", "budget", "verdict", "disk_gb"}
        (``disk_gb``: the sweep's run folders at their fullest, GiB).
    """
    from omegaconf import OmegaConf

    from orchestrator.checks.disk_plan import point_plan, sweep_need
    from training.memory_plan import RunShape, advice, auto_budget, model_shape, plan_memory
    from training.settings import RunSettings

    points = _points(name)
    worst, engines, disks = None, set(), []
    for _, cfg in points:
        if lora:
            cfg = OmegaConf.merge(cfg, _lora_on())
        engines.add(str(cfg.engine.name))
        disks.append(point_plan(cfg))
        if str(cfg.engine.name) != "local":
            continue
        cfg = OmegaConf.merge(cfg, {"train": {"micro_batch_tokens": "auto"}})
        shape, run = model_shape(cfg.model), RunShape.of(RunSettings.of(cfg, "cuda"))
        budget = auto_budget(shape, run, "cuda", device_gb)
        plan = plan_memory(shape, run, budget, "cuda", device_gb)
        if worst is None or plan.total_gb > worst[0].total_gb:
            worst = (plan, shape, run, budget)
    disk_gb = round(sweep_need(disks, parallel=False) / 2**30, 1)
    if worst is None:
        return {"preset": name, "engine": ",".join(sorted(engines)), "model": "", "params_b": 0.0,
                "points": len(points), "total_gb": None, "static_gb": None, "budget": None,
                "verdict": "verl preset (engine=verl): planned by verl", "disk_gb": disk_gb}
    plan, shape, run, budget = worst
    p = plan.parts
    static = p["weights"] + p["gradients"] + p["optimizer"] + p["reference"]
    if plan.fits:
        verdict = f"fits as is ({budget} tokens per pass)"
    else:
        verdict = advice(shape, run, "cuda", device_gb, plan)
    return {"preset": name, "engine": "local", "model": plan.model, "params_b": round(shape.n_params / 1e9, 2),
            "points": len(points), "total_gb": round(plan.total_gb, 1), "static_gb": round(static, 1),
            "budget": budget, "verdict": verdict, "disk_gb": disk_gb}


def presets_table(device_gb: float = 80.0) -> str:
    """The markdown table of :func:`preset_plan` for every paper preset."""
    lines = [f"| preset | model | parameters | weights, gradients, AdamW, reference (GiB) | planned peak on one "
             f"{device_gb:g} GiB GPU (GiB) | verdict | the sweep's run folders on disk (GiB) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    from core.progress import track

    for name in track(paper_presets(), "memory plans", unit="preset"):
        r = preset_plan(name, device_gb)
        if r["total_gb"] is None:
            lines.append(f"| `{name}` | | | | | {r['verdict']} | {r['disk_gb']:.1f} |")
            continue
        rows = [(f"`{name}`", r)]
        if r["params_b"] >= LORA_FROM_B:  # its LoRA variant, the suite's one-GPU choice (not the paper's protocol)
            rows.append((f"`{name} lora=on`", preset_plan(name, device_gb, lora=True)))
        for label, x in rows:
            lines.append(f"| {label} | {x['model']} | {x['params_b']:.2f}B | {x['static_gb']:.1f} | {x['total_gb']:.1f} | "
                         f"{x['verdict']} | {x['disk_gb']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device-gb", type=float, default=80.0, help="the GPU's memory, GiB (default 80)")
    args = ap.parse_args(argv)
    if not args.device_gb > 0:
        print(f"error: --device-gb={args.device_gb}: expected a number > 0", file=sys.stderr)
        return 2
    from core.console import setup

    setup(stream=sys.stderr)  # the progress on stderr: stdout is the table
    print(presets_table(args.device_gb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
