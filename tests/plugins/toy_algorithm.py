"""A plug-in algorithm in one file (the example of docs/extending.md): an advantage estimator registered by name,
with its own parameter check. ``conf/algo/toy_rank.yaml`` is its preset; a sweep finds both with
``plugins=[tests.plugins.toy_algorithm] hydra.searchpath=[file://tests/plugins/conf] algo=toy_rank``.

Rank advantage: within each group of responses to one prompt, a response's advantage is its reward's centred rank,
scaled to [-scale, scale] (ties share their mean rank), so it depends on the order of the rewards only, not on
their spread. For a group of rewards (0, 1, 1, 0): ranks (1.5, 3.5, 3.5, 1.5) of 1..4, centred by 2.5 and divided
by 1.5: (-2/3, 2/3, 2/3, -2/3) times ``scale``.
"""

from training.algorithms import register_advantage
from training.algorithms.registry import register_validator
from training.batch import from_groups, to_groups


@register_advantage("toy_rank", panels=("train/toy_rank_max",))  # its metric, plotted per step in the report
def toy_rank(batch, scale: float = 1.0):
    """Centred ranks of the rewards within each group, in [-scale, scale]. ``batch.rewards`` (B,) and
    ``batch.group_index`` (B,); returns (advantages (B,), metrics)."""
    matrix, order = to_groups(batch.rewards.double(), batch.group_index)
    g = matrix.shape[-1]
    less = (matrix.unsqueeze(-1) > matrix.unsqueeze(-2)).sum(-1).double()   # rewards below each one
    equal = (matrix.unsqueeze(-1) == matrix.unsqueeze(-2)).sum(-1).double()  # itself and its ties
    rank = less + (equal + 1) / 2                                             # mean rank of the ties, 1..g
    adv = (rank - (g + 1) / 2) / max((g - 1) / 2, 1) * scale
    return from_groups(adv, order).float(), {"toy_rank_max": float(adv.abs().max()) if adv.numel() else 0.0}


@register_validator("advantage", "toy_rank")
def _check(scale: float = 1.0, **_):
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise ValueError(f"scale={scale!r}: must be a number > 0")
    return []
