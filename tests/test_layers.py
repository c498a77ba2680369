"""The import graph of every package: no circle between modules (imports inside functions included), and no import
from a higher layer. Layers, bottom up: core (tasks, model I/O, samplers, run lifecycle); training and evaluation,
which never import each other; orchestrator (config, runs, MLflow, the evaluation command); reports. The entry points
above them (sweep.py, benchmarks/, scripts/) may import anything."""
import ast
from pathlib import Path

from tests.conftest import REPO

LAYER = {"core": 0, "training": 1, "evaluation": 1, "orchestrator": 2, "reports": 3}


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the suite's modules it imports anywhere in its source (absolute and relative imports, at module level
    or inside functions; ``from pkg import name`` counts as the submodule ``pkg.name`` when there is one, else as
    ``pkg``)."""
    files = {_module(p): p for pkg in LAYER for p in (REPO / pkg).rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            deps |= {d for d in map(owner, names) if d and d != mod}
        graph[mod] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_graph_sees_the_imports_it_must_see():
    """The checker itself, on imports whose presence is known: relative, absolute, inside a function."""
    g = import_graph()
    assert set(LAYER) <= {m.split(".")[0] for m in g} and len(g) > 60
    assert "core.generation" in g["core.agent"] and "core.generation" in g["core.sampling"]  # relative, module level
    assert "core.agent" in g["core.sampling.rollout"]  # inside a function
    assert "orchestrator.store.tracking" in g["orchestrator.store.mlflow_views"] and "evaluation.pipeline" in g["orchestrator.evaluate"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_circle_and_no_upward_import():
    g = import_graph()
    assert _circles(g) == []
    bad = [f"{m} imports {d}" for m, deps in sorted(g.items()) for d in sorted(deps)
           if (a := m.split(".")[0]) != (b := d.split(".")[0]) and LAYER[b] >= LAYER[a]]
    assert bad == []


def test_store_calls_go_through_the_store_object():
    """Every MLflow call of a run goes through its ``orchestrator.store.tracking.Store``, built once from the config: the
    outage limit is not threaded through the call sites (``outage_s`` on at most 10 lines of the four packages, where
    the config key is read, the store keeps it and the old ``retry`` entry takes it), and nothing outside
    ``tracking.py`` wraps a call in ``tracking.retry`` by hand."""
    lines, wrapped = [], []
    for pkg in ("core", "training", "evaluation", "orchestrator"):
        for p in sorted((REPO / pkg).rglob("*.py")):
            for i, line in enumerate(p.read_text().splitlines(), 1):
                where = f"{p.relative_to(REPO)}:{i}"
                if "outage_s" in line:
                    lines.append(where)
                if "tracking.retry(" in line and p.name != "tracking.py":
                    wrapped.append(where)
    assert len(lines) <= 10, lines
    assert wrapped == []


def test_no_two_modules_of_the_layers_share_a_file_name():
    """A file's name says which part it is (issue 57): no two modules of core/, training/, evaluation/ and
    orchestrator/ are named alike (``__init__`` and ``__main__`` aside)."""
    seen: dict[str, list[str]] = {}
    for pkg in ("core", "training", "evaluation", "orchestrator"):
        for p in (REPO / pkg).rglob("*.py"):
            if p.stem not in ("__init__", "__main__"):
                seen.setdefault(p.name, []).append(str(p.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
