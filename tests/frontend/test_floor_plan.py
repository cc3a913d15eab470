"""The frontend's import floor plan, measured from the source with ``ast``.

Three numbers keep ember/frontend from knotting itself up again (issue 24): function-local imports
(a lazy import usually hides a cycle), import cycles at module level (a circle that only works in one
import order), and the largest strongly connected component when function-local imports count too.
A package ``__init__`` importing its own submodules (to register them) is not a cycle edge, nor is
an import under ``if TYPE_CHECKING:`` (annotations only, never executed).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRONTEND = ROOT / "ember" / "frontend"
MAX_LOCAL_IMPORTS = 40
MAX_MODULE_LEVEL_CYCLES = 0
MAX_SCC = 8


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(FRONTEND.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom | ast.Import, known: set[str]) -> list[str]:
    """The frontend modules an import statement loads (``from pkg import sub`` names the submodule)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
    out = []
    for name in names:
        while name and name not in known:  # ``import ember.frontend.x.y`` of a non-module: its module
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _graph():
    mods = _modules()
    known = set(mods)
    top: dict[str, set[str]] = {m: set() for m in mods}
    every: dict[str, set[str]] = {m: set() for m in mods}
    local_count = 0
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        in_function: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                for inner in ast.walk(fn):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        in_function.add(id(inner))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            local = id(node) in in_function
            local_count += local
            for target in _resolve(mod, is_pkg, node, known):
                if target == mod:
                    continue
                if is_pkg and target.startswith(mod + "."):
                    continue  # a package registering its own submodules
                if _type_checking_only(tree, node):
                    continue  # annotations only: never executed
                every[mod].add(target)
                if not local:
                    top[mod].add(target)
    return local_count, top, every


def _type_checking_only(tree: ast.Module, node) -> bool:
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
            if any(n is node for n in ast.walk(stmt)):
                return True
    return False


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative, so deep chains need no recursion limit)."""
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
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
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
                out.append(sorted(comp))
    return out


def measure():
    local_count, top, every = _graph()
    top_cycles = [c for c in _sccs(top) if len(c) > 1]
    largest = max(_sccs(every), key=len)
    return local_count, top_cycles, largest


def test_frontend_floor_plan():
    local_count, top_cycles, largest = measure()
    numbers = (f"function-local imports: {local_count} (max {MAX_LOCAL_IMPORTS}); "
               f"module-level import cycles: {len(top_cycles)} (max {MAX_MODULE_LEVEL_CYCLES}) {top_cycles}; "
               f"largest SCC counting local imports: {len(largest)} (max {MAX_SCC}) {largest}")
    assert (local_count <= MAX_LOCAL_IMPORTS and len(top_cycles) <= MAX_MODULE_LEVEL_CYCLES
            and len(largest) <= MAX_SCC), \
        numbers + ". Import a tracker's base (variables.base), register with VariableTracker.build's table, " \
                  "or move the shared helper down a layer instead of importing inside a function."


def test_measure_sees_a_cycle(tmp_path):
    """The metric itself: Tarjan finds a two-module circle and leaves a chain alone."""
    assert sorted(map(len, _sccs({"a": {"b"}, "b": {"a"}, "c": {"a"}}))) == [1, 2]
    assert all(len(c) == 1 for c in _sccs({"a": {"b"}, "b": {"c"}, "c": set()}))


def test_every_late_bound_name_is_registered():
    """``trackers.Name`` / ``helpers.name`` resolve at trace time: a misspelt or unregistered one would
    only fail on the path that reads it, so check them all here from the source."""
    import ember  # noqa: F401  (imports every tracker module and builtins.py, which register)
    from ember.frontend.variables.base import helpers, trackers

    registries = {"trackers": trackers, "helpers": helpers}
    missing = []
    for path in sorted(FRONTEND.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in registries and node.attr not in ("add",):
                if node.attr not in vars(registries[node.value.id]):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert not missing, "not registered (decorate the helper with @helpers.add): " + ", ".join(missing)
