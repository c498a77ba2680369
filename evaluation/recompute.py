"""Recompute every evaluation table from saved samples, without sampling again.

    python -m evaluation.recompute SAMPLES.parquet [--ks 1 2 4 8] [--base-samples BASE.parquet] [--out DIR]
    python -m evaluation.recompute --study reports_out/<experiment>/study/runs.json [--out DIR]
    python -m evaluation.recompute --curves reports_out/<experiment>/curves/runs.json [--out DIR]

Writes one CSV per table to a new folder, ``recomputed/<samples folder name>`` (``-2``, ``-3``, ... when that
exists; never beside the samples, which sit in a run or MLflow artifact folder whose logged tables must stay as they
were), or to ``--out`` (refused when it exists and is not empty, unless ``--overwrite``), and prints them. With
``--base-samples``, the flip rates compare on the prompts both files share (their number is printed), and a base
evaluated with another protocol (samples per prompt, response-length cap, prompt template, as the samples show; the
sampler, dtype and decoding settings, as the ``protocol.json`` beside each file records) is refused unless
``--any-protocol``. With --study, the study's comparisons (evaluation.study: every method against the baseline and
the base model, paired prompt-bootstrap 95% CIs pooled over seeds) from the samples files the report's manifest
names; CSVs in a new ``<manifest folder>/recomputed`` (or --out), to set beside the report's own. With --curves, the
compute-performance curves (evaluation.curves: each validation point's metrics, the sigmoid fits, their intervals
and differences) from the ``validation.parquet`` files the report's curve manifest names. Bad arguments: one
line, exit 2, before anything is computed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from .tables import compute_tables


def main(argv=None) -> int:
    """``python -m evaluation.recompute`` (the module's docstring): 0, or 2 after one line naming a bad argument."""
    ap = _parser()
    args = ap.parse_args(argv)
    error = _argument_error(args)
    if error:
        print(error, file=sys.stderr)
        return 2
    if args.study:
        return _study(args)
    if args.curves:
        return _curves(args)
    if args.samples is None:
        ap.error("give a samples file or --study MANIFEST")
    read = _read_samples(args)
    if read is None:
        return 2
    samples, base = read
    n = int(samples.groupby(["benchmark", "prompt_id"]).size().min())
    ks = args.ks or [2 ** i for i in range(n.bit_length()) if 2 ** i <= n]
    if max(ks) > n:
        print(f"error: --ks {ks}: k={max(ks)} exceeds the n={n} samples per prompt", file=sys.stderr)
        return 2
    shared = total = None
    if base is not None:
        compared = _shared_with_base(args, samples, base)
        if compared is None:
            return 2
        shared, total = compared
    tables = _tables(args, samples, base, ks)
    out = Path(args.out) if args.out else new_folder(Path("recomputed") / Path(args.samples).resolve().parent.name)
    out.mkdir(parents=True, exist_ok=True)
    if shared is not None:
        print(f"flip rates on the {shared} of {total} prompts shared with --base-samples {args.base_samples}")
    for name, table in tables.items():
        if len(table):
            table.to_csv(out / f"{name}.csv")
            print(f"== {name}\n{table.round(4).to_string()}\n")
    print(f"tables: {out}")
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command's arguments (the module's docstring)."""
    ap = argparse.ArgumentParser(prog="python -m evaluation.recompute", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("samples", nargs="?", default=None)
    ap.add_argument("--study", default=None, help="a study manifest (runs.json, written by the report)")
    ap.add_argument("--curves", default=None, help="a curve manifest (curves/runs.json, written by the report)")
    ap.add_argument("--n-boot", type=int, default=10_000, help="bootstrap replicates (--study; --curves: the manifest's)")
    ap.add_argument("--markdown", action="store_true", help="--study: also print the tables as docs/study.md shows them")
    ap.add_argument("--ks", type=int, nargs="+", default=None, help="pass@k values (default: powers of two up to n)")
    ap.add_argument("--base-samples", default=None)
    ap.add_argument("--similarity-metric", default="rouge_l")
    ap.add_argument("--ucc-threshold", type=float, default=0.7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--overwrite", action="store_true", help="write into an existing, non-empty --out")
    ap.add_argument("--any-protocol", action="store_true",
                    help="compare against --base-samples evaluated with other settings instead of refusing")
    return ap


def _argument_error(args) -> str | None:
    """The line naming the first bad argument among ``--out``, ``--ks``, ``--n-boot``, ``--similarity-metric`` and
    ``--ucc-threshold``, or None when they are fine (checked before anything is read)."""
    if args.out and Path(args.out).exists() and (not Path(args.out).is_dir() or any(Path(args.out).iterdir())) \
            and not args.overwrite:
        return (f"error: --out={args.out}: exists and is not empty (its tables would be written over); choose another "
                "folder, leave --out out (a new folder), or add --overwrite")
    if args.ks is not None and min(args.ks) < 1:
        return f"error: --ks {args.ks}: every k must be >= 1"
    if args.n_boot < 1:
        return f"error: --n-boot {args.n_boot}: must be >= 1"
    from .metrics.diversity import METRICS

    if args.similarity_metric not in METRICS:
        return f"error: --similarity-metric {args.similarity_metric!r}: expected one of {list(METRICS)}"
    if not 0 <= args.ucc_threshold <= 1:
        return f"error: --ucc-threshold {args.ucc_threshold}: must be in [0, 1]"
    return None


def _read_samples(args) -> tuple[pd.DataFrame, pd.DataFrame | None] | None:
    """(the samples, the base samples or None) the arguments name, or None after one line naming a file that cannot
    be read or is not a samples table."""
    try:
        samples = pd.read_parquet(args.samples)
        base = pd.read_parquet(args.base_samples) if args.base_samples else None
    except Exception as e:  # a truncated or foreign file: one line naming it
        bad = args.base_samples if "samples" in locals() else args.samples
        print(f"error: {bad}: cannot be read as a samples table ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''})", file=sys.stderr)
        return None
    missing = [c for c in ("benchmark", "prompt_id", "correct", "response") if c not in samples.columns]
    if missing:
        print(f"error: {args.samples}: not a samples table (columns {missing} are missing)", file=sys.stderr)
        return None
    return samples, base


def _shared_with_base(args, samples: pd.DataFrame, base: pd.DataFrame) -> tuple[int, int] | None:
    """(prompts shared with the base samples, prompts in all) after a warning line per protocol difference, or None
    after one line refusing a base of another protocol (without ``--any-protocol``) or one that shares no prompt."""
    from .protocol import differences as protocol_settings
    from .protocol import read_beside
    from .tables import protocol_differences

    differ, shared, total = protocol_differences(samples, base)
    mine, theirs = read_beside(args.samples), read_beside(args.base_samples)
    if mine is not None and theirs is not None:  # each evaluation folder's protocol.json: sampler, dtype, decoding
        differ += [f"protocol.json {d}" for d in protocol_settings(mine, theirs)]
    if differ and not args.any_protocol:
        print(f"error: --base-samples {args.base_samples}: evaluated with another protocol: {'; '.join(differ)} "
              "(flip rates would compare the protocols; add --any-protocol to compute them anyway)", file=sys.stderr)
        return None
    for d in differ:
        print(f"warning: --base-samples: {d}", file=sys.stderr)
    if not shared:
        print(f"error: --base-samples {args.base_samples}: shares no prompt (benchmark, prompt_id) with "
              f"{args.samples}", file=sys.stderr)
        return None
    return shared, total


def _tables(args, samples: pd.DataFrame, base: pd.DataFrame | None, ks: list) -> dict:
    """Every registered table of ``samples`` (flip rates against ``base``), pass@k for ``ks``, the command's flags as
    the ``eval.*`` knobs they name; a line per table on stderr as it is computed."""
    from core.tasks import get_task, task_names

    same = {b: get_task(b).same_answer for b in samples["benchmark"].unique() if b in task_names()}
    import logging

    from core.console import setup

    setup(stream=sys.stderr)  # a line per table as it is computed (stdout is the tables)
    logging.getLogger("rlvr.tables").setLevel(logging.DEBUG)
    logging.getLogger("rlvr").info("computing the tables of %d samples (%d prompts), pass@k for k in %s",
                                   len(samples), samples.groupby(["benchmark", "prompt_id"]).ngroups, ks)
    knobs = {k: v for k, v in (("similarity_metric", args.similarity_metric), ("ucc_threshold", args.ucc_threshold))
             if v is not None}  # the command's flags are the eval.* knobs they name
    tables, _ = compute_tables(samples, ks, base_samples=base, same_answer=same, eval_cfg=knobs)
    return tables


def new_folder(path: Path) -> Path:
    """``path`` when it does not exist yet, else the first of ``path-2``, ``path-3``, ... that does not: a folder
    no earlier result is in."""
    if not path.exists():
        return path
    i = 2
    while path.with_name(f"{path.name}-{i}").exists():
        i += 1
    return path.with_name(f"{path.name}-{i}")


def _study(args) -> int:
    from .study import formatted, formatted_curves, read_manifest, study_tables, to_markdown

    try:
        man, samples = read_manifest(args.study)
    except (OSError, ValueError) as e:
        print(f"error: --study {args.study}: {e}", file=sys.stderr)
        return 2
    tables = study_tables(samples, man["methods"], man["baseline"], man.get("base"), man["ks"], n_boot=args.n_boot,
                          similarity_metric=man.get("similarity_metric", "rouge_l"),
                          threshold=man.get("ucc_threshold", 0.7))
    out = Path(args.out) if args.out else new_folder(Path(args.study).parent / "recomputed")
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv")
        print(f"== {name}\n{table.round(4).to_string() if len(table) else '(empty)'}\n")
    if args.markdown:
        print(to_markdown(formatted(tables["comparisons"], man["baseline"])) + "\n")
        if len(tables["base_curves"]):
            print(to_markdown(formatted_curves(tables["base_curves"])) + "\n")
            print(to_markdown(tables["crossings"]) + "\n")
    return 0


def _curves(args) -> int:
    """The curve section's tables from its manifest, and each validation point's metric tables (``val_metrics.csv``:
    one row per run and step, the columns the run logged as ``val/<task>/<metric>``)."""
    import json

    from .curves import curve_tables

    path = Path(args.curves)
    try:
        man = json.loads(path.read_text())
        frames = {lab: pd.read_parquet(path.parent / f) for lab, f in man["validation"].items()}
    except (OSError, ValueError, KeyError) as e:
        print(f"error: --curves {args.curves}: not a readable curve manifest ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    tables = curve_tables(frames, man["methods"], man.get("baseline"), man["n_boot"], man["seed"], man["skip"])
    rows = {}
    for lab, df in frames.items():
        for step, g in df.groupby("step", sort=True):
            n = int(g.groupby(["benchmark", "prompt_id"]).size().min())
            ks = sorted({1, *[k for k in (2 ** i for i in range(12)) if k <= n]})
            _, metrics = compute_tables(g.drop(columns=["step", "compute_flops"]), ks)
            rows[(lab, int(step))] = {"compute_flops": float(g["compute_flops"].iloc[0]),
                                      **{"val/" + k.removeprefix("eval/"): v for k, v in metrics.items()}}
    tables["val_metrics"] = pd.DataFrame.from_dict(rows, orient="index").rename_axis(["run", "step"])
    out = Path(args.out) if args.out else new_folder(path.parent / "recomputed")
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        if name.startswith("_"):
            continue
        table.to_csv(out / f"{name}.csv")
        print(f"== {name}\n{table.round(4).to_string() if len(table) else '(empty)'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
