"""Recompute every evaluation table from saved samples, without sampling again.

    python -m evaluation.recompute SAMPLES.parquet [--ks 1 2 4 8] [--base-samples BASE.parquet] [--out DIR]
    python -m evaluation.recompute --study reports_out/<experiment>/study/runs.json [--out DIR]

Writes one CSV per table next to the samples (or to --out) and prints them. With --study, the study's
comparisons (evaluation.study: every method against the baseline and the base model, paired prompt-bootstrap 95%
CIs pooled over seeds) from the samples files the report's manifest names; CSVs in <manifest folder>/recomputed
(or --out), to set beside the report's own (the report writes the manifest and its tables in the same folder).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from .tables import compute_tables


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluation.recompute", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("samples", nargs="?", default=None)
    ap.add_argument("--study", default=None, help="a study manifest (runs.json, written by the report)")
    ap.add_argument("--n-boot", type=int, default=10_000, help="bootstrap replicates (--study)")
    ap.add_argument("--markdown", action="store_true", help="--study: also print the tables as docs/study.md shows them")
    ap.add_argument("--ks", type=int, nargs="+", default=None, help="pass@k values (default: powers of two up to n)")
    ap.add_argument("--base-samples", default=None)
    ap.add_argument("--similarity-metric", default="rouge_l")
    ap.add_argument("--ucc-threshold", type=float, default=0.7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.study:
        return _study(args)
    if args.samples is None:
        ap.error("give a samples file or --study MANIFEST")
    try:
        samples = pd.read_parquet(args.samples)
        base = pd.read_parquet(args.base_samples) if args.base_samples else None
    except Exception as e:  # a truncated or foreign file: one line naming it
        bad = args.base_samples if "samples" in locals() else args.samples
        print(f"error: {bad}: cannot be read as a samples table ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''})", file=sys.stderr)
        return 2
    missing = [c for c in ("benchmark", "prompt_id", "correct", "response") if c not in samples.columns]
    if missing:
        print(f"error: {args.samples}: not a samples table (columns {missing} are missing)", file=sys.stderr)
        return 2
    n = int(samples.groupby(["benchmark", "prompt_id"]).size().min())
    ks = args.ks or [2 ** i for i in range(n.bit_length()) if 2 ** i <= n]
    if max(ks) > n:
        print(f"error: --ks {ks}: k={max(ks)} exceeds the n={n} samples per prompt", file=sys.stderr)
        return 2
    from core.tasks import get_task, task_names

    same = {b: get_task(b).same_answer for b in samples["benchmark"].unique() if b in task_names()}
    tables, _ = compute_tables(samples, ks, similarity_metric=args.similarity_metric, ucc_threshold=args.ucc_threshold,
                               base_samples=base, same_answer=same)
    out = Path(args.out) if args.out else Path(args.samples).parent
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        if len(table):
            table.to_csv(out / f"{name}.csv")
            print(f"== {name}\n{table.round(4).to_string()}\n")
    return 0


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
    out = Path(args.out) if args.out else Path(args.study).parent / "recomputed"
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


if __name__ == "__main__":
    sys.exit(main())
