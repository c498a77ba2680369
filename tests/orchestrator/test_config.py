"""Config validation, sweep expansion and run identity."""
import pytest

from orchestrator import ConfigError, config_hash, validate_config
from orchestrator.preflight import sweep_points


def _cfg(*overrides):
    [(_, cfg)] = sweep_points(list(overrides))
    return cfg


def test_sweep_expansion_gives_the_cartesian_product():
    points = sweep_points(["algo=quatro,gspo", "delta=0.01,0.1"])
    assert [p for p, _ in points] == [["algo=quatro", "delta=0.01"], ["algo=quatro", "delta=0.1"],
                                      ["algo=gspo", "delta=0.01"], ["algo=gspo", "delta=0.1"]]
    assert points[1][1].algo.advantage.delta == 0.1  # delta reaches QUATRO through interpolation


def test_identity_ignores_delta_where_the_algorithm_does_not_use_it():
    assert config_hash(_cfg("algo=gspo", "delta=0.01")) == config_hash(_cfg("algo=gspo", "delta=0.1"))
    assert config_hash(_cfg("algo=quatro", "delta=0.01")) != config_hash(_cfg("algo=quatro", "delta=0.1"))
    assert config_hash(_cfg("algo=gspo")) != config_hash(_cfg("algo=gspo", "seed=1"))
    assert config_hash(_cfg("algo=gspo")) == config_hash(_cfg("algo=gspo", "experiment_name=other"))


@pytest.mark.parametrize("overrides,fragment", [
    (["delta=-1"], "delta=-1"),
    (["eval.n=4"], "eval.n=4"),
    (["algo.policy_loss.clip_ratio_low=-0.1", "algo=gspo"], "clip_ratio_low=-0.1"),
    (["algo.policy_loss.loss_agg_mode=sum"], "loss_agg_mode='sum'"),
    (["algo.kl_beta=-1"], "kl_beta=-1"),
    (["+algo.advantage.detla=0.1"], "detla"),
    (["train.group_size=0"], "train.group_size=0"),
    (["train.top_p=1.5"], "train.top_p=1.5"),
    (["eval.benchmarks=[math500]"], "eval.data_dir"),
])
def test_bad_values_are_named(overrides, fragment):
    with pytest.raises(ConfigError) as e:
        validate_config(_cfg(*overrides))
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg


def test_defaults_and_every_algorithm_validate():
    for algo in ("quatro", "gspo", "grpo"):
        validate_config(_cfg(f"algo={algo}"))
