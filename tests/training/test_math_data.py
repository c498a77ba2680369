"""The MATH training-set loader, on a real MATH-format file (MATH500 from ../shared) -- local JSONL and the
hub code path pointed at the same local file (nothing is downloaded)."""
import json

import pytest

from core.tasks.math_train import MathData, load_math_train


@pytest.fixture(scope="module")
def math_file(benchmark_dir):
    return benchmark_dir / "math500" / "test.jsonl"


def test_local_jsonl_rows_golds_levels_and_split(math_file):
    records = [json.loads(x) for x in math_file.read_text().splitlines() if x.strip()]
    train, held = load_math_train(MathData.of(source="local", path=str(math_file), n_eval=10, seed=1))
    assert len(train) + len(held) == len(records) == 500 and len(held) == 10
    by_id = {str(r["unique_id"]): r for r in records}
    for row in train[:50] + held:
        rec = by_id[row["id"]]
        assert row["gold"] == rec["answer"].strip()  # the file's own answer field
        assert row["prompt"].startswith(rec["problem"]) and row["prompt"].endswith("within \\boxed{}.")
        assert row["level"] == rec["level"]
    again, _ = load_math_train(MathData.of(source="local", path=str(math_file), n_eval=10, seed=1))
    assert [r["id"] for r in again] == [r["id"] for r in train]  # seeded


def test_level_filter_and_cap(math_file):
    train, _ = load_math_train(MathData.of(source="local", path=str(math_file), levels=[5], max_prompts=20))
    assert len(train) == 20 and {r["level"] for r in train} == {5}


def test_hub_code_path_reads_the_same_rows_from_a_local_file(math_file):
    local, _ = load_math_train(MathData.of(source="local", path=str(math_file)))
    hub, _ = load_math_train(MathData.of(source="hub", hub_path="json", hub_config=None, hub_split="train", data_files=str(math_file)))
    assert [(r["id"], r["gold"]) for r in hub] == [(r["id"], r["gold"]) for r in local]


def test_bad_input_names_the_value(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.path="):
        load_math_train(MathData.of(source="local", path=str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError, match="data.source='web'"):
        load_math_train(MathData.of(source="web"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "What is 1+1?"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_math_train(MathData.of(source="local", path=str(bad)))
    odd = tmp_path / "odd.jsonl"
    odd.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="odd.jsonl:1: expected a JSON object"):
        load_math_train(MathData.of(source="local", path=str(odd)))
    lst = tmp_path / "lst.jsonl"
    lst.write_text(json.dumps({"problem": "Roots of x^2=1?", "answer": [1, -1]}) + "\n")
    assert load_math_train(MathData.of(source="local", path=str(lst)))[0][0]["gold"] == "1, -1"
    with pytest.raises(ValueError, match="no MATH training rows"):
        load_math_train(MathData.of(source="local", path=str(_one(tmp_path)), levels=[9]))


def _one(tmp_path):
    p = tmp_path / "one.jsonl"
    p.write_text(json.dumps({"problem": "1+1?", "answer": "2", "level": 1}) + "\n")
    return p
