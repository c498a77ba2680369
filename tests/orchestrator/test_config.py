"""Config validation, sweep expansion and run identity."""
import pytest

from orchestrator import ConfigError, config_hash, validate_config
from orchestrator.checks.preflight import sweep_points


def _cfg(*overrides):
    [(_, cfg)] = sweep_points(list(overrides))
    return cfg


def test_sweep_expansion_gives_the_cartesian_product():
    points = sweep_points(["algo=quatro,gspo", "delta=0.01,0.1"])
    assert [p for p, _ in points] == [["algo=quatro", "delta=0.01"], ["algo=quatro", "delta=0.1"],
                                      ["algo=gspo", "delta=0.01"], ["algo=gspo", "delta=0.1"]]
    assert points[1][1].algo.advantage.delta == 0.1  # delta reaches QUATRO through interpolation


@pytest.mark.slow
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
    (["eval.benchmarks=[math5000]"], "unknown benchmark 'math5000'"),
    (["eval.benchmarks=[math500]", "eval.data_dir=/nonexistent"], "eval.data_dir='/nonexistent'"),
    (["algo=quatro", "algo.advantage.lambda_min=0"], "lambda_min=0"),
    (["algo=quatro", "algo.policy_loss.ratio_level=word"], "ratio_level='word'"),
    (["algo=quatro", "algo.policy_loss.log_ratio_scale=median"], "log_ratio_scale='median'"),
    (["algo=grpo", "algo.policy_loss.clip_ratio_low=1.5"], "clip_ratio_low=1.5"),
    (["algo=tr_grpo", "algo.policy_loss.weighting=inverse"], "weighting='inverse'"),
    (["algo=tr_grpo", "algo.policy_loss.tau=0"], "tau=0"),
    (["algo=tr_grpo", "algo.policy_loss.weight_reading=divide"], "weight_reading='divide'"),
    (["algo=tr_grpo", "algo.policy_loss.weight_placement=inside"], "weight_placement='inside'"),
    (["algo=grpo_verl", "algo.policy_loss.dual_clip=0.5"], "dual_clip=0.5"),
    (["algo=exppo", "algo.advantage.lam=1.2"], "lam=1.2"),
    (["algo=grpo_ur", "algo.advantage.beta=-0.1"], "beta=-0.1"),
    (["algo=f_grpo", "algo.advantage.gamma=-1"], "gamma=-1"),
    (["algo=gmpo", "algo.policy_loss.loss_agg_mode=token-mean"], "loss_agg_mode='token-mean'"),
    (["algo=dapo", "algo.dynamic_sampling.max_num_gen_batches=0"], "max_num_gen_batches=0"),
    (["algo=dapo", "algo.overlong_buffer.length=100"], "overlong_buffer.length=100"),
    (["algo=dapo", "algo.overlong_buffer.fraction=0"], "overlong_buffer.fraction=0"),
    (["algo=dapo", "algo.overlong_buffer.fraction=1.5"], "overlong_buffer.fraction=1.5"),
    (["algo=grpo_h", "algo.entropy_coef=-0.001"], "entropy_coef=-0.001"),
    (["algo=exppo", "exppo_lambda=1.5"], "lam=1.5"),
    (["eval.extra_temperatures=[1.5,-1]"], "eval.extra_temperatures=[1.5, -1]"),
    (["eval.benchmarks=[kk]"], "'kk' is the held-out split of data=kk, but data=arithmetic"),
    (["data=kk", "data.train_sizes=[2,9]"], "n_people=9"),
    (["data=kk", "data.train_sizes=3"], "data.train_sizes=3: expected a list"),
    (["data=kk", "data.eval_sizes=[3,3]"], "appears twice"),
    (["eval.extra_temperatures=1.5"], "eval.extra_temperatures=1.5: expected a list"),
    (["eval.extra_temperatures=[1e6]"], "in [0.01, 10]"),
    (["eval.ks=4"], "eval.ks=4: expected a list"),
    (["data=math", "data.levels=[6]"], "data.levels=[6]"),
    (["data=math", "data.n_eval=-5"], "data.n_eval=-5"),
    (["data=math", "data.max_prompts=0"], "data.max_prompts=0"),
    (["eval.dtype=fp8"], "eval.dtype='fp8'"),
    (["eval.device=tpu"], "eval.device='tpu'"),
    (["eval.flip_k=0"], "eval.flip_k=0"),
    (["eval.checkpoints=some"], "eval.checkpoints='some'"),
    (["train.save_every=-1"], "train.save_every=-1"),
    (["eval.vllm.gpu_memory_utilization=1.5"], "gpu_memory_utilization=1.5"),
    (["+eval.vllm.swap_space=4"], "eval.vllm.swap_space=4: unknown key"),
    (["eval.vllm.tensor_parallel_size=0"], "eval.vllm.tensor_parallel_size=0"),
    (["eval.score_tokens=0"], "eval.score_tokens=0"),
    # settings that cannot take effect (issue 70)
    (["data.validation_prompts=4", "train.validate_every=10", "train.steps=4"],
     "train.validate_every=10: larger than train.steps=4, so only the start and the end would be validated"),
    (["train.rollout.staleness=4", "train.steps=4", "train.rollout.sampler=hf"],
     "train.rollout.staleness=4 with train.steps=4: every step would train on the starting policy's samples"),
])
def test_bad_values_are_named(overrides, fragment):
    with pytest.raises(ConfigError) as e:
        validate_config(_cfg(*overrides))
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg


def test_validation_that_cannot_serve_its_purpose_is_warned():
    """Issue 70: too few validation points for a compute curve, and prompts held out for no validation, are warned
    (a user may mean them: the start and the end only, a split kept for a later run), each naming the fix."""
    few = validate_config(_cfg("data.validation_prompts=4", "train.validate_every=4", "train.steps=4"))
    assert any(w.startswith("train.validate_every=4 with train.steps=4: 1 validation point(s) after step 0, fewer "
                            "than the 4") and "train.validate_every=1 for a curve" in w for w in few), few
    idle = validate_config(_cfg("data.validation_prompts=8"))
    assert any(w.startswith("data.validation_prompts=8: held out of training, but nothing validates on them")
               for w in idle), idle
    assert not any("validat" in w for w in validate_config(_cfg("data.validation_prompts=8", "train.validate_every=1",
                                                                "train.steps=4"))), "4 points after step 0: a curve"


def test_settings_that_cannot_take_effect_are_warned_per_point_and_refused_for_a_whole_sweep(capsys):
    """Issue 70: a correction threshold its correction does not read (the cap of ``none``; the lower bound of the
    one-sided ``token_tis``, ``sequence_mis``: training/corrections.py's formulas) is a warning on that point when
    another point of the sweep reads it (a factorial sweep over corrections), and refused, exit 2, when no point
    does; ``eval=smoke`` (8-token answers) with a model other than the tiny test model is a warning."""
    from orchestrator.checks.preflight import check_command_line
    from orchestrator.checks.validate import unused_settings

    cap = validate_config(_cfg("train.rollout.correction=none", "train.rollout.correction_cap=3"))
    assert any(w.startswith("train.rollout.correction_cap=3 has no effect under train.rollout.correction=none")
               for w in cap), cap
    stale = "train.rollout.staleness=1"  # a correction other than none corrects something: the staleness here
    lower = validate_config(_cfg("train.rollout.correction=token_tis", "train.rollout.correction_lower=0.5", stale))
    assert any(w.startswith("train.rollout.correction_lower=0.5 has no effect under train.rollout.correction=token_tis")
               for w in lower), lower
    # read: no warning (icepop reads both bounds; token_tis reads the cap; defaults say nothing)
    for ok in (["train.rollout.correction=icepop", "train.rollout.correction_cap=3", "train.rollout.correction_lower=0.5", stale],
               ["train.rollout.correction=token_tis", "train.rollout.correction_cap=3", stale], []):
        assert not any("has no effect" in w for w in validate_config(_cfg(*ok))), ok
    # over a sweep: refused when no point reads it, passed (the per-point warning above) when one does
    both = [cfg for _, cfg in sweep_points(["train.rollout.correction=none,token_tis", "train.rollout.correction_cap=3", stale])]
    assert unused_settings(both) == []
    with pytest.raises(ConfigError, match=r"^train.rollout.correction_lower=0.5: no point of this sweep reads it "
                                          r"\(train.rollout.correction=none,token_tis\)"):
        unused_settings([cfg for _, cfg in sweep_points(["train.rollout.correction=none,token_tis",
                                                         "train.rollout.correction_lower=0.5", stale])])
    with pytest.raises(SystemExit) as exit_:
        check_command_line(["-m", "model=tiny-random", "eval=smoke", "train.rollout.correction_cap=4"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: train.rollout.correction_cap=4: no point of this sweep")
    smoke = validate_config(_cfg("eval=smoke"))
    assert any(w.startswith("eval=smoke cuts answers at 8 tokens for the tiny test model; with model=smollm2-135m-instruct")
               for w in smoke), smoke
    assert not any(w.startswith("eval=smoke") for w in validate_config(_cfg("eval=smoke", "model=tiny-random")))


ALGOS = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "gpg", "gmpo", "quatro", "tr_grpo", "tr_grpo_literal", "tr_grpo_equal", "tr_grpo_random", "tr_grpo_reverse", "exppo",
         "grpo_h", "grpo_ur", "f_grpo"]


@pytest.mark.slow
def test_defaults_and_every_algorithm_validate():
    for algo in ALGOS:
        warnings = validate_config(_cfg(f"algo={algo}"))
        assert (len(warnings) == 1) == (algo == "tr_grpo_literal"), (algo, warnings)


@pytest.mark.slow
def test_presets_carry_the_papers_defaults():
    assert _cfg("algo=dapo").algo.policy_loss.clip_ratio_high == 0.28
    assert _cfg("algo=dapo").algo.policy_loss.loss_agg_mode == "token-mean"
    assert _cfg("algo=gspo").algo.policy_loss.clip_ratio_low == 3e-4
    assert _cfg("algo=dr_grpo").algo.advantage.norm_by_std is False
    assert _cfg("algo=dr_grpo", "train.max_new_tokens=64").algo.policy_loss.norm_constant == 64
    assert _cfg("algo=gmpo").algo.policy_loss.clip_ratio_low == 0.4
    tr = _cfg("algo=tr_grpo").algo.policy_loss
    assert (tr.tau, tr.weight_reading, tr.weight_placement) == (9.0, "inverse_temperature", "outside_clip")
    literal = _cfg("algo=tr_grpo_literal").algo.policy_loss
    assert (literal.tau, literal.weight_reading, literal.weight_placement) == (9.0, "literal", "inside_clip")
    grpo_verl = _cfg("algo=grpo_verl").algo
    assert (grpo_verl.policy_loss.dual_clip, grpo_verl.policy_loss.loss_agg_mode, grpo_verl.kl_beta) == (3.0, "token-mean", 0.001)
    assert _cfg("algo=grpo").algo.policy_loss.get("dual_clip") is None   # the suite's own preset is unchanged
    assert _cfg("algo=exppo").algo.advantage.lam == 0.2


def test_the_validation_inside_the_loop_is_part_of_the_training_identity(tiny_cfg):
    """Issue 69: with ``train.validate_every > 0`` the training loop validates under ``eval.validation.*`` and the
    evaluation's decoding, so points that differ in them train apart; points that differ in the benchmarks' sample
    count still share one training (and the run that evaluates it takes its validation along); without validation the
    validation keys change nothing."""
    from omegaconf import OmegaConf

    from orchestrator.point.identity import training_hash

    val = OmegaConf.merge(tiny_cfg, {"data": {"validation_prompts": 4}, "train": {"validate_every": 2}})
    assert training_hash(val) != training_hash(OmegaConf.merge(val, {"eval": {"validation": {"n": 8}}}))
    assert training_hash(val) != training_hash(OmegaConf.merge(val, {"eval": {"temperature": 0.6}}))
    assert training_hash(val) == training_hash(OmegaConf.merge(val, {"eval": {"n": 8}}))
    assert training_hash(tiny_cfg) == training_hash(OmegaConf.merge(tiny_cfg, {"eval": {"validation": {"n": 8}}}))
