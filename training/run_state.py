"""What a local training run must carry across a stop to continue exactly: the order it draws prompts in, the random
states, and the saved state file (policy, optimiser, scheduler, metrics not yet logged, token counts).

:class:`PromptOrder` draws each step's prompts (a seeded shuffle, popped from the end, reshuffled when spent);
:class:`RandomStates` captures and restores Python's, NumPy's and torch's generators; :func:`save_state` and
:func:`load_state` write and read ``run_dir/state/train_state.pt`` atomically (tensors, numbers and strings only: a
state file cannot run code when it is read).
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

STATE_FILE = Path("state") / "train_state.pt"


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _py_rng_to(state) -> dict:
    version, internal, gauss = state
    return {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}


def _py_rng_from(d) -> tuple:
    return int(d["version"]), tuple(int(x) for x in d["internal"].tolist()), d["gauss"]


def _np_rng_to(state) -> dict:
    name, keys, pos, has_gauss, cached = state
    return {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}


def _np_rng_from(d) -> tuple:
    return d["name"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["cached"]


class PromptOrder:
    """The order a run draws its training prompts in: a shuffle of all prompts seeded with the run's seed, popped from
    the end; when it is spent, the next shuffle from the same generator.

    Args:
        prompts: the training rows; seed: the run's seed.
    """

    def __init__(self, prompts: list, seed: int):
        self.prompts = prompts
        self.order: list[int] = []
        self.rng = random.Random(seed)

    def next_rows(self, n: int) -> list:
        """The next ``n`` prompt rows."""
        rows = []
        for _ in range(n):
            if not self.order:
                self.order.extend(range(len(self.prompts)))
                self.rng.shuffle(self.order)
            rows.append(self.prompts[self.order.pop()])
        return rows

    def state_dict(self) -> dict:
        return {"order": list(self.order), "order_rng": _py_rng_to(self.rng.getstate())}

    def load_state_dict(self, d: dict) -> None:
        self.order[:] = [int(i) for i in d["order"]]
        self.rng.setstate(_py_rng_from(d["order_rng"]))


@dataclass
class RandomStates:
    """Python's, NumPy's and torch's global generator states at one moment (:meth:`capture`), to go back to
    (:meth:`restore`): what a stopped step's redo needs."""

    py: tuple
    np: tuple
    torch: torch.Tensor

    @classmethod
    def capture(cls) -> "RandomStates":
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state())

    def restore(self) -> None:
        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.set_rng_state(self.torch)

    def state_dict(self) -> dict:
        return {"py_rng": _py_rng_to(self.py), "np_rng": _np_rng_to(self.np), "torch_rng": self.torch}

    @classmethod
    def from_state_dict(cls, d: dict) -> "RandomStates":
        return cls(_py_rng_from(d["py_rng"]), _np_rng_from(d["np_rng"]), d["torch_rng"])


def has_state(run_dir) -> bool:
    """Whether ``run_dir`` holds a saved training state to resume from (the orchestrator asks before resuming)."""
    return (Path(run_dir) / STATE_FILE).is_file()


def state_paths(run_dir) -> list[Path]:
    """The files and folders of ``run_dir`` that hold the training state (what a resume reads, nothing a finished
    run's evaluation, re-evaluation or reproduction needs): ``run_dir/state``."""
    return [Path(run_dir) / STATE_FILE.parent]


def load_state(run_dir, device="cpu") -> dict:
    """The saved training state of ``run_dir``, loaded with ``torch.load(weights_only=True)``.

    Raises:
        ValueError: the state file resolves (through links) outside ``run_dir``.
    """
    run_dir = Path(run_dir).resolve()
    path = (run_dir / STATE_FILE).resolve()
    if run_dir not in path.parents:
        raise ValueError(f"training state {run_dir / STATE_FILE} resolves to {path}, outside the run folder {run_dir}")
    return torch.load(path, map_location=device, weights_only=True)


def save_state(run_dir, state: dict) -> Path:
    """Write ``state`` to ``run_dir/state/train_state.pt`` atomically (a kill mid-save leaves the previous one)."""
    path = Path(run_dir) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path
