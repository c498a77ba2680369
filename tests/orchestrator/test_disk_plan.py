"""The disk plan at pre-flight (issue 69, orchestrator/checks/disk_plan.py): a point's kept policies and state by hand
from the real model's parameter count and the keys; a sweep that cannot fit its disk refused in one line before any
work, naming a ``train.save_every`` that fits (checked against the free space it reports)."""
import os
import re
import subprocess

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO
from tests.prewarmed import python


def test_a_points_plan_by_hand_from_the_models_parameters(tiny_cfg, tiny_policy):
    from orchestrator.checks.disk_plan import TOKENIZER_BYTES, point_plan, sweep_need

    model, _ = tiny_policy
    n = sum(p.numel() for p in model.parameters())  # the real model's count (tied embeddings counted once)
    cfg = OmegaConf.merge(tiny_cfg, {"train": {"steps": 10, "save_every": 3, "checkpoint_every": 2,
                                               "validate_every": 5, "keep_top_k": 2},
                                     "eval": {"select_on": "validation"}})
    plan = point_plan(cfg)
    policy = 4 * n + TOKENIZER_BYTES
    assert plan.policy == policy and plan.kept_policies == 3  # steps 3, 6, 9
    assert plan.kept == {"final checkpoint": policy, "3 kept checkpoints (train.save_every=3)": 3 * policy,
                         "2 selectable policies (train.keep_top_k)": 2 * policy}
    t = cfg.train
    queue = t.prompts_per_step * t.group_size * t.max_new_tokens * 16.0
    assert plan.state == pytest.approx(2 * (4 * n + 8 * n + queue))  # weights + AdamW's two moments, twice
    plain = point_plan(OmegaConf.merge(tiny_cfg, {"train": {"save_every": 0, "checkpoint_every": 0}}))
    assert plain.kept == {"final checkpoint": policy} and plain.state == pytest.approx(12 * n + queue)
    # a sweep: every point's kept parts and samples, one state at a time (a cluster launcher: all at once)
    both = [plan, plain]
    kept = sum(sum(p.kept.values()) + p.samples for p in both)
    assert sweep_need(both, parallel=False) == pytest.approx(kept + plan.state)
    assert sweep_need(both, parallel=True) == pytest.approx(kept + plan.state + plain.state)


def test_a_sweep_that_cannot_fit_its_disk_is_refused_in_one_line_before_any_work(tmp_path):
    """Qwen2.5-Math-1.5B (its shape ships with the suite: nothing is downloaded) keeping every one of 2,000 steps'
    policies: about 11 TB, more than any test machine's disk."""
    proc = subprocess.run([*python(), str(REPO / "sweep.py"), "-m", "model=qwen2.5-math-1.5b", "train.steps=2000",
                           "train.save_every=1", "train.memory_check=false"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    line = lines[0]
    assert line.startswith("error: disk plan: ") and "does not fit" in line and "(the sweep keeps 1999)" in line
    fit = int(re.search(r"; (\d+) kept checkpoints fit", line).group(1))
    every = int(re.search(r"train\.save_every=(\d+) or more", line).group(1))
    assert len(range(every, 2000, every)) <= fit < len(range(every - 1, 2000, every - 1))  # the smallest that fits
    assert not list(tmp_path.iterdir())  # no store, no sweep folder: nothing started
