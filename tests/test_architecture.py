"""The architecture, checked: no import circle, imports only point down the layers, modules and classes stay small.

Plain Python over ``ast`` (no new dependency). The layers are those of docs/architecture.md, bottom first; a
module may import its own package and anything in a lower or equal layer, never a higher one. Imports under
``if TYPE_CHECKING:`` are annotations, not dependencies, and are not counted; imports inside functions are.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import name of each source tree (envs/ and sandboxes/ install as agentrl.envs and agentrl.sandboxes).
TREES = {"agentrl": ROOT / "agentrl", "agentrl.envs": ROOT / "envs", "agentrl.sandboxes": ROOT / "sandboxes"}

# Bottom first. "agentrl" is the package face (agentrl/__init__.py: it registers the built-in envs).
LAYERS: list[set[str]] = [
    {"agentrl.config", "agentrl.syncpool", "agentrl._moved", "agentrl.netguard", "agentrl.proctemp", "agentrl.raystart",
     "agentrl.childwatch", "agentrl.gcheap"},
    {"agentrl.core"},
    {"agentrl.registration", "agentrl.tools", "agentrl.policy", "agentrl.trajectory"},
    {"agentrl.sandboxes"},
    {"agentrl.envs"},
    {"agentrl"},
    {"agentrl.models"},
    {"agentrl.chat"},
    {"agentrl.inference", "agentrl.manager"},
    {"agentrl.agent"},
    {"agentrl.trainer"},
    {"agentrl.gateway", "agentrl.eval"},
    {"agentrl.controller"},
    {"agentrl.viewer", "agentrl.simulate"},
    {"agentrl.testing"},
    {"agentrl.commands", "agentrl.cli"},
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
MAX_MODULE_LINES = 550
MAX_CLASS_LINES = 300
WHY = "One idea:"  # a docstring that says why a long module or class is one idea, starting with these words


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg, tree in TREES.items():
        for path in sorted(tree.rglob("*.py")):
            rel = path.relative_to(tree).with_suffix("")
            if pkg == "agentrl" and rel.parts[0] in ("envs", "sandboxes"):
                continue  # symlinks some checkouts keep; the trees above are the sources
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


MODULES = modules()


def resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if is_pkg else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = base + ("." + node.module if node.module else "")
            else:
                mod = node.module or ""
            # "from P import x" names the submodule P.x when there is one (P's __init__ runs for any submodule
            # import: no edge of its own), else an attribute of P.
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        for t in targets:
            r = resolve(t)
            if r and r != name:
                out.add(r)
    return out


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def package_of(module: str) -> str:
    for depth in (3, 2):  # agentrl.envs.x -> agentrl.envs; agentrl.trainer.x -> agentrl.trainer
        head = ".".join(module.split(".")[:depth - 1])
        if head in RANK and head != "agentrl":
            return head
    return module if module in RANK else ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_every_package_has_a_layer():
    missing = sorted({package_of(m) for m in MODULES} - set(RANK))
    assert not missing, f"add these packages to LAYERS (and docs/architecture.md): {missing}"


def test_no_import_circle():
    found = cycles(GRAPH)
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_layers():
    bad = []
    for module, targets in GRAPH.items():
        src = package_of(module)
        for t in targets:
            dst = package_of(t)
            if src != dst and RANK[dst] > RANK[src]:
                bad.append(f"{module} imports {t} ({src} is below {dst})")
    assert not bad, "\n".join(sorted(bad))


def test_the_checks_catch_a_circle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert RANK[package_of("agentrl.manager.host")] < RANK[package_of("agentrl.controller.run")]
    assert package_of("agentrl.envs.swe.env") == "agentrl.envs"


def test_modules_and_classes_stay_small():
    long = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES and WHY not in (ast.get_docstring(tree) or ""):
            long.append(f"{module}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_CLASS_LINES and WHY not in (ast.get_docstring(node) or ""):
                    long.append(f"{module}.{node.name}: class of {n} lines")
    assert not long, ("split these where their invariants differ, or say in the docstring why each is one idea "
                      f"('{WHY} ...'):\n" + "\n".join(long))


def test_old_import_paths_keep_working_and_name_the_new_place():
    import importlib
    import sys
    import warnings

    from agentrl._moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mod = importlib.import_module(old)
        assert mod is importlib.import_module(new), old
        assert any(new in str(w.message) and w.category is DeprecationWarning for w in caught), old
    from agentrl.pipeline import TrainConfig, train  # the README's and examples' old spelling

    from agentrl.controller import TrainConfig as T2, train as t2
    assert (TrainConfig, train) == (T2, t2)
