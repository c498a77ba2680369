"""The verl engine's translation of every experiment preset's points (and of every algorithm preset and a few
hand-made settings) into verl's overrides and the algorithm spec its workers receive, against what the code of
147c0b6 gave (issue 67's refactor into a package of parts and one settings object must not change a single override).

The fixture ``data/verl_overrides_147c0b6.json`` holds, per command line and point, a hash of the overrides and the spec
(the repository's path and the verl modules' package path normalised, so it holds on any checkout); it was written by
:func:`_record` run with the code of 147c0b6. ExPPO's shuffled-surprisal control's spec carries the run's seed since
(the generator its permutations draw from, by design): it is compared without that key.
"""
import hashlib
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed (scripts/install.sh installs it)")

from orchestrator.checks.preflight import sweep_points  # noqa: E402
from tests.conftest import REPO  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "verl_overrides_147c0b6.json"


#: the presets checked in the suite (the fixture holds every preset: ``_record(every=True)`` compares them all, about a
#: minute on 2 cores): the paper-scale QUATRO comparison, the verl preset, DAPO with ExPPO's shaping (dynamic sampling,
#: overlong shaping), ExPPO's components (the shuffled control), the search agents (tools), the CPU smoke preset
CHECKED = ("quatro_main", "quatro_paper_verl", "exppo_dapo", "exppo_components_cpu", "trgrpo_search_cpu", "verl_smoke")


def command_lines(every: bool = False) -> list[list[str]]:
    """Every experiment preset with engine=verl (``every``; else those of :data:`CHECKED`), every algorithm preset,
    and three hand-made settings (checkpoints and kept policies, LoRA with IcePop, the CPU platform with geo_rs)."""
    lines = [[f"experiment={p.stem}", "engine=verl", "tools.search.url=http://127.0.0.1:8000"]
             for p in sorted((REPO / "sweeps" / "experiment").glob("*.yaml")) if every or p.stem in CHECKED]
    lines += [[f"algo={p.stem}", "engine=verl", "model=tiny-random", "eval=smoke"]
              for p in sorted((REPO / "sweeps" / "algo").glob("*.yaml"))]
    lines += [["engine=verl", "model=tiny-random", "eval=smoke", "train.steps=6", "train.save_every=2",
               "train.checkpoint_every=3"],
              ["engine=verl", "model=tiny-random", "eval=smoke", "train.lora.rank=8", "train.rollout.correction=icepop"],
              ["engine=verl", "model=tiny-random", "eval=smoke", "engine.device=cpu", "train.rollout.correction=geo_rs",
               "train.rollout.correction_cap=3"]]
    return lines


def digest(overrides, spec) -> str:
    """The hash the fixture holds: the overrides (or the error's text) and the spec, the repository's path and the
    verl engine's module path normalised."""
    text = json.dumps({"overrides": overrides, "spec": spec}, sort_keys=True).replace(str(REPO), "<repo>")
    text = re.sub(r"training[./]engines[./]verl(_support)?[./]", "<verl>/", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record(every: bool = False) -> tuple[dict, set]:
    """({command line and point: digest}, the points whose spec carried a seed) of this checkout's code (how the
    fixture was written, at 147c0b6, with ``every``)."""
    from pathlib import Path as P

    from core.tasks import load_plugins
    from training.engines import verl as V

    out, seeded = {}, set()
    for line in command_lines(every):
        for i, (_, cfg) in enumerate(sweep_points(line, multirun=True)):
            try:
                load_plugins(cfg.get("plugins"))
                o, s = V.verl_overrides(cfg, "/models/m", P("/d"), P("/r")), V.algo_spec(cfg)
                seeded.add(" ".join(line) + f" #{i}") if s.pop("seed", None) is not None else None
            except Exception as e:
                o, s = f"{type(e).__name__}: {e}", None
            out[" ".join(line) + f" #{i}"] = digest(o, s)
    return out, seeded


@pytest.mark.slow
def test_every_points_overrides_and_spec_equal_those_of_147c0b6():
    want = json.loads(FIXTURE.read_text())
    got, seeded = _record()
    assert set(got) <= set(want) and len(got) > 40
    differ = sorted(k for k in got if got[k] != want[k])
    assert differ == [], differ[:5]
    assert len(seeded) == 1 and all("exppo_components" in k for k in seeded)  # the shuffled control
