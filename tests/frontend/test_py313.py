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


# ---- the 3.13-only handlers' stack semantics, driven directly (reachable through the interpreter only on 3.13)
from ember.frontend.handlers import py313 as H  # noqa: E402
from ember.frontend.interpreter import is_null  # noqa: E402
from ember.frontend.variables.base import NULL, ConstantVariable as C  # noqa: E402


class _Fn:
    """A callee that records how it was called."""
    def __init__(self):
        self.calls = []

    def call(self, tx, args, kwargs):
        self.calls.append(([a.as_constant() for a in args], {k: v.as_constant() for k, v in kwargs.items()}))
        return C("ret")


class _Tx:
    def __init__(self, *stack, **locals_):
        self.stack = list(stack)
        self.locals = dict(locals_)
        self.f_globals = {}
        self.ip = 0
        self.cells = {}
        self.code = _Tx.__init__.__code__  # no cell variables

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        items = self.stack[len(self.stack) - n:]
        del self.stack[len(self.stack) - n:]
        return items

    def load_global(self, name):
        return C(f"global {name}")


def _ins(opname, arg=None, argval=None, target=None):
    return bc.Instr(0, opname, arg, argval, 0, 1, target)


def _consts(tx):
    return ["NULL" if is_null(v) else v.as_constant() for v in tx.stack]


def test_superinstructions_over_locals():
    tx = _Tx(a=C(1), b=C(2))
    H.LOAD_FAST_LOAD_FAST(tx, _ins("LOAD_FAST_LOAD_FAST", 0x01, ("a", "b")))
    assert _consts(tx) == [1, 2]
    tx = _Tx(C(10), C(20))  # STACK[-1] = 20 goes to the first name, STACK[-2] = 10 to the second
    H.STORE_FAST_STORE_FAST(tx, _ins("STORE_FAST_STORE_FAST", 0x01, ("x", "y")))
    assert tx.stack == [] and tx.locals["x"].as_constant() == 20 and tx.locals["y"].as_constant() == 10
    tx = _Tx(C(5), q=C(7))
    H.STORE_FAST_LOAD_FAST(tx, _ins("STORE_FAST_LOAD_FAST", 0x01, ("p", "q")))
    assert tx.locals["p"].as_constant() == 5 and _consts(tx) == [7]


def test_null_is_pushed_after_the_callable():
    tx = _Tx()
    H.LOAD_GLOBAL(tx, _ins("LOAD_GLOBAL", 1, "f"))
    H.LOAD_GLOBAL(tx, _ins("LOAD_GLOBAL", 2, "g"))
    assert _consts(tx) == ["global f", "NULL", "global g"]


def test_call_and_call_kw_layouts():
    f = _Fn()
    tx = _Tx(f, NULL, C(1), C(2))  # f(1, 2)
    H.CALL(tx, _ins("CALL", 2))
    assert f.calls == [([1, 2], {})] and _consts(tx) == ["ret"]
    g = _Fn()
    tx = _Tx(g, C("self"), C(1))  # method call: [method, self, args]
    H.CALL(tx, _ins("CALL", 1))
    assert g.calls == [(["self", 1], {})]
    h = _Fn()
    tx = _Tx(h, NULL, C(1), C(2), C(3), C(("k", "j")))  # h(1, k=2, j=3)
    H.CALL_KW(tx, _ins("CALL_KW", 3))
    assert h.calls == [([1], {"k": 2, "j": 3})] and _consts(tx) == ["ret"]


def test_to_bool_and_coercing_compare():
    tx = _Tx(C([1]))
    H.TO_BOOL(tx, _ins("TO_BOOL"))
    assert tx.stack[-1].as_constant() is True
    tx = _Tx(C(1), C(2))
    H.COMPARE_OP(tx, _ins("COMPARE_OP", (0 << 5) | 16, "<"))
    assert tx.stack[-1].as_constant() is True


def test_fstring_pieces():
    tx = _Tx(C("a"))
    H.CONVERT_VALUE(tx, _ins("CONVERT_VALUE", 2))
    H.FORMAT_SIMPLE(tx, _ins("FORMAT_SIMPLE"))
    assert _consts(tx) == ["'a'"]
    tx = _Tx(C(3.14159), C(".2f"))
    H.FORMAT_WITH_SPEC(tx, _ins("FORMAT_WITH_SPEC"))
    assert _consts(tx) == ["3.14"]


def test_make_function_then_attributes():
    def inner(z=1):
        return z
    tx = _Tx(C((5,)), C(inner.__code__))
    tx.f_globals = globals()
    H.MAKE_FUNCTION(tx, _ins("MAKE_FUNCTION"))
    H.SET_FUNCTION_ATTRIBUTE(tx, _ins("SET_FUNCTION_ATTRIBUTE", 0x01))
    (fn,) = tx.stack
    assert [d.as_constant() for d in fn.defaults] == [5] and fn.closure is None
    tx = _Tx(C(None), fn)
    with pytest.raises(Exception, match="SET_FUNCTION_ATTRIBUTE"):
        H.SET_FUNCTION_ATTRIBUTE(tx, _ins("SET_FUNCTION_ATTRIBUTE", 0x10))


def test_for_iter_exhausted_skips_end_for_and_pop_top():
    from ember.frontend.variables.iterators import ListIteratorVariable
    tx = _Tx(ListIteratorVariable([C(1)]))
    H.FOR_ITER(tx, _ins("FOR_ITER", 3, 40, target=7))
    assert tx.stack[-1].as_constant() == 1 and len(tx.stack) == 2 and tx.ip == 0
    H.END_FOR(tx, _ins("END_FOR"))  # 3.13's END_FOR pops only the value
    assert len(tx.stack) == 1
    H.FOR_ITER(tx, _ins("FOR_ITER", 3, 40, target=7))
    assert tx.stack == [] and tx.ip == 9


def test_generated_bytecode_runs_on_python313():
    """Loop drivers and break functions (torch-free code generation) run natively on 3.13: the
    3.11/3.12 tests of that code, run by a 3.13 pytest (a crash or a wrong value fails)."""
    py = _python313()
    if py is None:
        pytest.skip("no python3.13 on this machine")
    site = os.environ.get("EMBER_PY313_SITE", "/tmp/py313")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, str(ROOT)]))
    if subprocess.run([py, "-c", "import bytecode, pytest"], env=env, capture_output=True).returncode:
        pytest.skip(f"python3.13 cannot import `bytecode` and `pytest`: pip install --target {site} bytecode pytest")
    r = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                        "tests/frontend/test_loop_drivers.py", "tests/frontend/test_break_native.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_load_fast_of_a_cell_slot_pushes_the_cell():
    # 3.13 builds a closure tuple with LOAD_FAST of the cell variables (LOAD_CLOSURE became a pseudo-op)
    from ember.frontend.interpreter import CellVariable

    def outer():
        a = 1
        return lambda: a
    cell = CellVariable(C(1))
    tx = _Tx(x=C(2))
    tx.cells, tx.code = {"a": cell}, outer.__code__
    H.LOAD_FAST(tx, _ins("LOAD_FAST", 0, "a"))
    H.LOAD_FAST(tx, _ins("LOAD_FAST", 1, "x"))
    assert tx.stack[0] is cell and tx.stack[1].as_constant() == 2


def test_cells_loaded_sees_closure_builds():
    def outer():
        a = 1
        return lambda: a
    loaded = {n for i in bc.decode(outer.__code__) for n in bc.cells_loaded(outer.__code__, i)}
    assert loaded == {"a"}
