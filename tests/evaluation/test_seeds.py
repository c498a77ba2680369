"""The evaluation seed reaches every sampler (issue 60; an evaluation harness whose seed never reached its sampler
moved AIME25 by 7 points between runs): through the evaluation's own path (``eval.seed`` -> each prompt's seed ->
the sampler), the same seed draws bitwise equal samples and another seed other samples, for the transformers sampler
and the agent loop (multi-turn episodes with a search tool) here; vLLM's in tests/e2e/test_vllm.py (its engine starts
once there)."""
import pandas as pd
import pytest
from omegaconf import OmegaConf

from core.sampling import HFSampler, SamplingSettings
from core.tasks import get_task, load_prompts
from evaluation.pipeline import Draw, sample_benchmarks


@pytest.mark.slow
def test_the_evaluation_seed_reaches_the_transformers_sampler_and_the_agent_loop(tiny_policy, tiny_cfg, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    world = OmegaConf.create({"name": "search_demo", "n_entities": 10, "seed": 3, "n_eval": 8, "max_prompts": None,
                              "response_prefix": "<search>"})
    rows = {"arithmetic": load_prompts(tiny_cfg.data, "eval")[:3],
            "search_demo": [dict(r, benchmark="search_demo") for r in get_task("search_demo").load("eval", world)[:2]]}
    sampler = HFSampler(*tiny_policy, with_entropy=False)

    def draw(seed: int, name: str) -> pd.DataFrame:
        (tmp_path / name).mkdir()
        return sample_benchmarks(sampler, rows, Draw(3, seed, 4, SamplingSettings(1.0, 1.0, 24)),
                                 tmp_path / name / "samples.parquet", tools_cfg=tiny_cfg.get("tools"))

    a, b, other = draw(0, "a"), draw(0, "b"), draw(1, "c")
    key = ["benchmark", "prompt_id", "sample_idx"]
    a, b, other = (x.sort_values(key).reset_index(drop=True) for x in (a, b, other))
    assert (a["seed"] != other["seed"]).all() and (a["seed"] == b["seed"]).all()  # each prompt's seed from eval.seed
    for bench in rows:
        mine, again, theirs = (x[x["benchmark"] == bench] for x in (a, b, other))
        assert len(mine) == 3 * len(rows[bench])
        assert mine["response"].tolist() == again["response"].tolist(), bench  # the same seed: the same samples
        assert mine["response"].tolist() != theirs["response"].tolist(), bench  # another seed: other samples
    episodes = a[a["benchmark"] == "search_demo"]
    assert episodes["tool_calls"].notna().all()  # sampled by the agent loop (its episodes count their tool calls)


def test_the_report_says_when_the_runs_compared_were_evaluated_with_different_seeds():
    from reports.seed_groups import eval_seed_note

    runs = pd.DataFrame({"label": ["Initialization", "grpo", "gspo"],
                         "params": [{"eval.seed": "0"}, {"eval.seed": "0"}, {"eval.seed": "1"}]})
    note = eval_seed_note(runs)
    assert note is not None and "eval.seed=0: Initialization, grpo; eval.seed=1: gspo" in note
    assert eval_seed_note(runs.iloc[:2]) is None and eval_seed_note(runs.iloc[:0]) is None
