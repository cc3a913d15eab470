"""The floor plan of docs/architecture.md, checked on the source with ``ast`` (imports inside functions
count too, since a lazy import is still a dependency):

- ``ember/diagnostics`` sits below what it reports on: it imports nothing of ember but itself and
  ``ember.config``;
- the environment is read in ``ember/config.py`` only (``Config.from_env`` and ``Environment``), so
  every variable has one parser and one documented meaning;
- CPython version checks live in the bytecode layer (``ember/frontend/bytecode.py``) only.
"""
from __future__ import annotations

import ast
from pathlib import Path

EMBER = Path(__file__).resolve().parent.parent / "ember"

DIAGNOSTICS_MAY_IMPORT = ("ember.diagnostics", "ember.config")
ENVIRONMENT_READERS = {"config.py"}          # paths relative to ember/
VERSION_CHECKERS = {"frontend/bytecode.py"}


def _modules(root: Path):
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root).as_posix(), ast.parse(path.read_text(), str(path))


def _package(rel: str) -> str:
    parts = ["ember", *rel[:-3].split("/")]
    return ".".join(parts[:-1]) if parts[-1] != "__init__" else ".".join(parts[:-1])


def _imported(rel: str, tree: ast.AST):
    """(line, absolute module name) of every import in the module, relative ones resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(rel).split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from ember import frontend` imports ember.frontend: name each imported submodule
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}" if module == "ember" else module


def diagnostics_violations(root: Path = EMBER) -> list[str]:
    out = []
    for rel, tree in _modules(root / "diagnostics"):
        for line, module in _imported("diagnostics/" + rel, tree):
            if (module == "ember" or module.startswith("ember.")) and not any(
                    module == ok or module.startswith(ok + ".") for ok in DIAGNOSTICS_MAY_IMPORT):
                out.append(f"ember/diagnostics/{rel}:{line} imports {module}")
    return out


def _attribute_uses(tree: ast.AST, owner: str, names: set):
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name) \
                and node.value.id == owner:
            yield node.lineno, f"{owner}.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == owner and node.level == 0:
            for alias in node.names:
                if alias.name in names:
                    yield node.lineno, f"from {owner} import {alias.name}"


def environment_violations(root: Path = EMBER) -> list[str]:
    names = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
    return [f"ember/{rel}:{line} uses {what}" for rel, tree in _modules(root) if rel not in ENVIRONMENT_READERS
            for line, what in _attribute_uses(tree, "os", names)]


def version_check_violations(root: Path = EMBER) -> list[str]:
    return [f"ember/{rel}:{line} uses {what}" for rel, tree in _modules(root) if rel not in VERSION_CHECKERS
            for line, what in _attribute_uses(tree, "sys", {"version_info", "hexversion"})]


def test_diagnostics_import_nothing_above_them():
    assert diagnostics_violations() == [], ("ember/diagnostics must not depend on what it reports on: move the "
                                            "code that drives ember up to ember/api.py")


def test_the_environment_is_read_in_config_only():
    assert environment_violations() == [], ("read environment variables through ember.config: an EMBER_* "
                                            "setting is a Config field, another program's variable an "
                                            "Environment property (ember/config.py)")


def test_python_version_checks_live_in_the_bytecode_layer():
    assert version_check_violations() == [], ("ask ember.frontend.bytecode (PY, check_python_version) instead "
                                              "of reading sys.version_info")


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Each rule flags a planted violation (a checker that finds nothing proves nothing)."""
    (tmp_path / "diagnostics").mkdir()
    (tmp_path / "frontend").mkdir()
    (tmp_path / "diagnostics" / "report.py").write_text(
        "import ember.diagnostics.logging\nfrom ember.config import config\n"
        "def f():\n    from ember.frontend.cache import FrameCache\n    import ember\n    from .. import api\n")
    (tmp_path / "frontend" / "bytecode.py").write_text("import sys\nPY = sys.version_info[:2]\n")
    (tmp_path / "native.py").write_text("import os, sys\nfrom os import getenv\nX = os.environ.get('A')\n"
                                        "if sys.version_info >= (3, 12):\n    pass\n")
    (tmp_path / "config.py").write_text("import os\nV = os.environ.get('EMBER_X')\n")
    assert diagnostics_violations(tmp_path) == [
        "ember/diagnostics/report.py:4 imports ember.frontend.cache",
        "ember/diagnostics/report.py:5 imports ember",
        "ember/diagnostics/report.py:6 imports ember.api",
    ]
    assert environment_violations(tmp_path) == ["ember/native.py:2 uses from os import getenv",
                                                "ember/native.py:3 uses os.environ"]
    assert version_check_violations(tmp_path) == ["ember/native.py:4 uses sys.version_info"]


def test_no_benchmark_script_shadows_a_package():
    """`python benchmarks/x.py` (and tests that put benchmarks/ on sys.path) make every script there
    importable by its bare name: a `benchmarks/openvino.py` hid the real openvino package."""
    import importlib.util
    import pathlib

    here = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
    packages = {"openvino", "triton", "numpy", "transformers", "timm", "torchvision", "diffusers", "bytecode",
                "torch", "ember", "ts", "torchserve", "model_archiver"}
    stems = {p.stem for p in here.glob("*.py")} | {p.name for p in here.iterdir() if p.is_dir()}
    assert not stems & packages, f"rename these benchmark scripts: {sorted(stems & packages)}"
    for stem in stems:  # nor a standard-library module
        assert stem not in __import__("sys").stdlib_module_names, f"benchmarks/{stem} shadows the standard library"
    assert importlib.util.find_spec("ember") is not None
