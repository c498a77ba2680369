"""Answer verification speed, side by side in one run: this suite's verifier (:mod:`core.verify`: a worker
process, its rewrites, the exact check, the cache, and plain math-verify's verdict computed beside its own)
and plain math-verify (``verify(parse(G), parse(response))`` in this process, ``G`` the gold as
:func:`core.verify.gold_texts` writes it first, no cache).

    python -m benchmarks.verifier --data-dir DIR [--samples PATH ...] [--limit N]
                                  [--adversarial-cap 60]

Three measurements:

1. **Golds**: every local benchmark gold (3,064) against ``The final answer is \\boxed{gold}.``: calls per
   second, cold cache, one worker process against plain math-verify in one process.
2. **Real samples tables** (``--samples``, default: every ``samples.parquet`` under ``multirun/`` and
   ``outputs/``, which the README's main job writes): the cache hit rate (pairs answered without a new
   verification) and samples per second of both.
3. **Adversarial outputs**: wall time of each (a 1 MB output, ``9^{9^{9^{9}}}``, 10,000 nested braces, a
   slow exact comparison); plain math-verify runs each in a child process killed after
   ``--adversarial-cap`` seconds (its own alarms cannot interrupt C code).
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import time
from pathlib import Path

BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench", "gsm8k", "gpqa_diamond_mcq")

ADVERSARIAL = {
    "1 MB output": ("x" * 1_000_000 + " \\boxed{8}", "7"),
    "9^{9^{9^{9}}}": ("\\boxed{9^{9^{9^{9}}}}", "7"),
    "10,000 nested braces": ("{" * 10_000 + "7" + "}" * 10_000, "7"),
    "10,000 nested braces, boxed": ("\\boxed{" + "{" * 10_000 + "7" + "}" * 10_000 + "}", "7"),
    "500 open boxes": ("\\boxed{" * 500 + "}" * 1000, "7"),
    "equal nested radicals": ("\\boxed{\\sqrt{2}+\\sqrt{3}}", "\\sqrt{5+2\\sqrt{6}}"),
}


def plain_check(response: str, gold: str) -> bool:
    """Plain math-verify on (response, gold): the reference the suite's audit compares against."""
    from math_verify import parse, verify

    from core.verify import gold_texts

    try:
        return bool(verify(parse(gold_texts(gold)[0]), parse(response)))
    except Exception:
        return False


def _plain_child(response, gold, out):
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    out.put(plain_check(response, gold))


def time_plain_capped(response: str, gold: str, cap_s: float) -> tuple[float, str]:
    """(seconds, verdict or 'killed') of plain math-verify in a child process killed after ``cap_s``."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    t0 = time.perf_counter()
    proc = ctx.Process(target=_plain_child, args=(response, gold, out))
    proc.start()
    proc.join(cap_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return time.perf_counter() - t0, "killed"
    return time.perf_counter() - t0, str(out.get()) if not out.empty() else "crashed"


def side_by_side(responses, golds) -> dict:
    """Wall seconds and verdicts of the suite's verifier (fresh, one worker) and plain math-verify."""
    from core.verify import Verifier

    v = Verifier(workers=1)
    v.check_many(["\\boxed{1}"], ["1"])            # start the worker outside the timing
    v.cache.clear()
    v.lookups = v.hits = 0
    t0 = time.perf_counter()
    ours = v.check_many(responses, golds)
    t_ours = time.perf_counter() - t0
    hit_rate = v.hits / max(v.lookups, 1)
    v.close()
    plain_check("\\boxed{1}", "1")                  # import and warm math-verify outside the timing too
    t0 = time.perf_counter()
    plain = [plain_check(r, g) for r, g in zip(responses, golds)]
    t_plain = time.perf_counter() - t0
    return {"n": len(responses), "ours_s": t_ours, "plain_s": t_plain, "hit_rate": hit_rate,
            "ours_correct": sum(c.correct for c in ours), "plain_correct": sum(plain),
            "disagree": sum(c.correct != p for c, p in zip(ours, plain)),
            "reference_matches_plain": sum(bool(c.reference) == p for c, p in zip(ours, plain))}


def sweep_samples(roots=(Path("multirun"), Path("outputs"))) -> list[Path]:
    """Every ``samples.parquet`` a sweep wrote under ``roots`` (temperature sub-folders included)."""
    return sorted(p for root in roots if root.is_dir() for p in root.glob("**/samples.parquet"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.verifier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True, help="a folder of <benchmark>/test.jsonl files")
    ap.add_argument("--samples", nargs="*", default=None,
                    help="samples.parquet files (default: every one under multirun/ and outputs/)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many golds and samples (smoke runs)")
    ap.add_argument("--adversarial-cap", type=float, default=60.0)
    args = ap.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    import pandas as pd

    from core.tasks.math import load_local_benchmark
    from core.verify import Verifier

    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        print(f"benchmarks.verifier: --data-dir {data_dir} does not exist")
        return 2
    golds = [r["gold"] for b in BENCHMARKS for r in load_local_benchmark(b, data_dir)][:args.limit]
    g = side_by_side([f"The final answer is \\boxed{{{x}}}." for x in golds], golds)
    print(f"\n1. golds against their boxed form: {g['n']} pairs")
    print("| verifier | seconds | calls/s | accepted | vs plain |\n| --- | --- | --- | --- | --- |")
    print(f"| suite (1 worker, cold cache) | {g['ours_s']:.1f} | {g['n'] / g['ours_s']:.0f} | {g['ours_correct']} "
          f"| {g['plain_s'] / g['ours_s']:.2f}x |")
    print(f"| plain math-verify | {g['plain_s']:.1f} | {g['n'] / g['plain_s']:.0f} | {g['plain_correct']} | 1.00x |")

    paths = [Path(p) for p in args.samples] if args.samples else sweep_samples()
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"benchmarks.verifier: --samples {missing} do not exist")
        return 2
    if not paths:
        print("\n2. no samples table (run the README's main job, or pass --samples)")
    else:
        table = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
        table = table.head(args.limit) if args.limit else table
        s = side_by_side(table["response"].tolist(), table["gold"].tolist())
        print(f"\n2. {len(paths)} samples tables: {s['n']} samples; cache hit rate {s['hit_rate']:.3f}; "
              f"verdicts differ on {s['disagree']}; the suite's reference verdict equals plain's on "
              f"{s['reference_matches_plain']}/{s['n']}")
        print("| verifier | seconds | samples/s | correct | vs plain |\n| --- | --- | --- | --- | --- |")
        print(f"| suite (1 worker, cached) | {s['ours_s']:.2f} | {s['n'] / s['ours_s']:.0f} | {s['ours_correct']} "
              f"| {s['plain_s'] / s['ours_s']:.2f}x |")
        print(f"| plain math-verify | {s['plain_s']:.2f} | {s['n'] / s['plain_s']:.0f} | {s['plain_correct']} "
              f"| 1.00x |")

    print(f"\n3. adversarial outputs (plain math-verify killed after {args.adversarial_cap:g} s)")
    print("| output | suite s | suite verdict | plain s | plain verdict |\n| --- | --- | --- | --- | --- |")
    worst = 0.0
    for name, (response, gold) in ADVERSARIAL.items():
        v = Verifier(workers=1)
        v.check_many(["\\boxed{1}"], ["1"])
        t0 = time.perf_counter()
        verdict = v.check_many([response], [gold])[0].correct
        t_ours = time.perf_counter() - t0
        v.close()
        worst = max(worst, t_ours)
        t_plain, plain = time_plain_capped(response, gold, args.adversarial_cap)
        print(f"| {name} | {t_ours:.2f} | {verdict} | {t_plain:.2f} | {plain} |")
    print(f"\nworst case, suite: {worst:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
