"""The training engines' shape, read from the code (issue 67): no file in training/ over 500 lines; the Hydra config
is read at the engines' entries only, into one settings object per run (:class:`training.settings.RunSettings`), and
no function below them receives it; the update's data contract is a typed batch, with no string-keyed dict."""
import ast
import dataclasses

from tests.conftest import REPO

TRAINING = REPO / "training"
MAX_LINES = 500
#: where a function may take the composed config (a parameter named ``cfg``): the training stage's entry, the engine
#: protocol's record, each engine's entry points (its package's ``__init__``), and the settings builders
ENTRIES = {
    "training/__init__.py": {"train"},
    "training/engines/__init__.py": {"_no_warnings", "run"},
    "training/engines/local/__init__.py": {"train", "validate", "memory_plan"},
    "training/engines/verl/__init__.py": {"train", "validate", "check_verl_config", "verl_overrides", "algo_spec",
                                          "verl_environment"},
    "training/settings.py": {"of", "read"},
    "training/engines/verl/verl_keys.py": {"of"},
}


def _files():
    return sorted(p for p in TRAINING.rglob("*.py"))


def test_no_file_in_training_is_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in _files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_function_below_an_engines_entry_receives_the_config():
    """A parameter named ``cfg`` or annotated ``DictConfig`` appears only in :data:`ENTRIES`, and outside those
    functions no code of training/ names ``cfg`` at all (a global, a closure, an attribute of a run)."""
    found = []
    for path in _files():
        rel = str(path.relative_to(REPO))
        allowed = ENTRIES.get(rel, set())
        tree = ast.parse(path.read_text())
        inside = set()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            takes = [a.arg for a in args if a.arg == "cfg" or "DictConfig" in ast.unparse(a.annotation or ast.Constant(""))]
            if fn.name in allowed:
                inside |= {id(n) for n in ast.walk(fn)}
            elif takes:
                found.append(f"{rel}:{fn.lineno} {fn.name}({', '.join(takes)})")
        for node in ast.walk(tree):
            if id(node) in inside:
                continue
            if (isinstance(node, ast.Name) and node.id == "cfg") or (isinstance(node, ast.Attribute) and node.attr == "cfg"):
                found.append(f"{rel}:{node.lineno} names cfg")
    assert found == []


def test_the_local_engine_reads_the_config_in_its_entry_only():
    """The loop's phases are the package's modules; only its ``__init__`` (the entry) imports OmegaConf's types or
    names the config."""
    for path in sorted((TRAINING / "engines" / "local").glob("local_*.py")):
        text = path.read_text()
        assert "DictConfig" not in text and "OmegaConf.select" not in text and "cfg." not in text, path.name


def test_the_batch_is_typed():
    """Every per-response field of :class:`training.batch.RolloutBatch` is named (a tensor, or the tool trace's
    record): no dict of string keys; and no code of training/ reads an ``extras`` attribute."""
    from training.batch import RolloutBatch, ToolTrace

    kinds = {f.name: str(f.type) for f in dataclasses.fields(RolloutBatch)}
    assert not any("dict" in t.lower() for t in kinds.values()), kinds
    assert kinds["tools"].startswith("Optional[ToolTrace]") and dataclasses.is_dataclass(ToolTrace)
    reads = [f"{p.relative_to(REPO)}:{n.lineno}" for p in _files() for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Attribute) and n.attr == "extras"]
    assert reads == []


def test_the_old_log_probs_take_one_path_named_by_an_enum():
    """:class:`training.update.UpdateSettings` names the path (:class:`training.settings.OldLogprobs`) instead of
    ``align_old`` / ``deferred_old`` flags, and a correction is always passed to the objective (no tensor-or-record
    union)."""
    import inspect

    from training.corrections import Correction
    from training.settings import OldLogprobs
    from training.update import UpdateSettings, policy_objective

    names = {f.name for f in dataclasses.fields(UpdateSettings)}
    assert "old_logprobs" in names and not names & {"align_old", "deferred_old", "aligned"}
    assert UpdateSettings().old_logprobs is OldLogprobs.KEPT
    param = inspect.signature(policy_objective).parameters["correction"]
    assert isinstance(param.default, Correction) and "weights" not in inspect.signature(policy_objective).parameters
