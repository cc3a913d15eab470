"""The C++ path as the default for CPU tensors (issue 25): the compiler check and its one-time
fallback, background and parallel builds, the warm process that compiles nothing, dynamic sizes
and training through ``ember.compile``, and every registry op proven on the C++ renderer."""
import copy
import logging
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.config import config
from ember.native import compile_aten_graph, cpp_build, ops
from tests.native.harness import compare, trace

HAS_CXX = any(map(__import__("shutil").which, ("c++", "g++")))
needs_cxx = pytest.mark.skipif(not HAS_CXX, reason="no C++ compiler")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def fresh_probe(monkeypatch):
    """This process's compiler check forgotten (and restored after the test)."""
    monkeypatch.setattr(cpp_build, "_PROBED", {})
    monkeypatch.setattr(cpp_build, "_WARNED", set())


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if "C++ path for CPU tensors is off" in r.getMessage()]


@pytest.mark.parametrize("broken", ["missing", "fails"])
def test_no_working_compiler_falls_back_once(broken, tmp_path, monkeypatch, fresh_probe, caplog):
    """No compiler on PATH, or one that fails to build: ember.compile still runs (eager's kernels,
    the same results), and one warning for the process says why and how to choose the ATen path."""
    if broken == "missing":
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.delenv("CXX", raising=False)
    else:
        if HAS_CXX:  # the real compiler's check first: a later check must not trust what it built
            assert cpp_build.problem() is None
            cpp_build._PROBED.clear()
        fake = tmp_path / "fake-cxx"
        fake.write_text("#!/bin/sh\necho 'fake-cxx: no OpenMP here' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv("CXX", str(fake))
    builds = cpp_build.BUILDS["count"]
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        for k in (2.0, 3.0):  # two graphs, one warning
            fn = ember.compile(lambda x: torch.softmax(x * k, -1))
            x = torch.randn(5, 7)
            compare(fn(x), torch.softmax(x * k, -1))
    msgs = _warnings(caplog)
    assert len(msgs) == 1, msgs
    assert "EMBER_NATIVE_CPU=aten" in msgs[0] and ("g++" in msgs[0] or "no OpenMP here" in msgs[0]), msgs[0]
    assert cpp_build.BUILDS["count"] == builds  # (the fake compiler's failure is not counted as a build)


@needs_cxx
def test_working_compiler_is_checked_once(fresh_probe, native_cache):
    assert cpp_build.problem(native_cache) is None
    assert cpp_build.problem(native_cache) is None and len(cpp_build._PROBED) == 1


@needs_cxx
def test_builds_run_in_the_background_and_in_parallel(native_cache, monkeypatch):
    """compile_aten_graph returns while its unit is still building (the next graph is generated
    meanwhile); two graphs' units are in the compiler at the same time; the first call waits."""
    if cpp_build._executor()._max_workers < 2:
        pytest.skip("one build thread (config.compile_threads=1 or one core)")
    both = threading.Barrier(2, timeout=60)
    real = cpp_build._compile
    started = []

    def compile_(cxx, source):
        started.append(threading.current_thread().name)
        both.wait()  # returns only when the other unit's build is running too
        return real(cxx, source)
    monkeypatch.setattr(cpp_build, "_compile", compile_)
    xs = [torch.randn(6, 11), torch.randn(6, 11)]
    fns = [lambda x: torch.sigmoid(x) * 1.25 + x, lambda x: torch.tanh(x) * 0.75 - x]
    compiled = [compile_aten_graph(trace(fn, [x]), [x], options={"cache_dir": native_cache}) for fn, x in zip(fns, xs)]
    for c, fn, x in zip(compiled, fns, xs):
        compare(c(x), fn(x))
    assert len(started) == 2 and all(n.startswith("ember-cpp-build") for n in started), started


WARM = """
import sys, torch
from ember.config import config
config.cache_dir = sys.argv[1]
import ember
from ember.native import cpp_build
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
torch.manual_seed(0)
x = torch.randn(4, 8)
out = ember.compile(m)(x)
out.sum().backward()
torch.testing.assert_close(out, m(x))
print("BUILDS", cpp_build.BUILDS["count"], "LIBS", len(cpp_build._LIBS))
"""


@needs_cxx
def test_second_process_compiles_nothing(tmp_path):
    """The default path, forward and backward: a cold process builds its units (and the compiler
    check); a second one loads every .so from the disk cache without running the compiler."""
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", WARM, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(r.stdout.split())
    cold, warm = runs
    assert int(cold[1]) >= 3, cold  # the check's unit, the forward's and the backward's
    assert warm[1] == "0" and int(warm[3]) >= 2, warm  # (LIBS: the graphs' units, loaded from disk)


@needs_cxx
def test_dynamic_training_through_cpp(native_cache):
    """dynamic=True: forward and backward graphs with the batch size as a kernel argument, built
    once, trained at three sizes against eager (values and gradients)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.LayerNorm(24), torch.nn.Linear(24, 5))
    ref = copy.deepcopy(model)

    def step(m, x, y):
        loss = F.cross_entropy(torch.softmax(m(x), -1) * 3, y)
        loss.backward()
        return loss
    compiled = ember.compile(step, dynamic=True)
    builds = None
    for n in (6, 9, 17):
        x, y = torch.randn(n, 12), torch.randint(0, 5, (n,))
        compare(compiled(model, x, y), step(ref, x, y), 1e-5, 1e-5)
        for a, b in zip(model.parameters(), ref.parameters()):
            compare(a.grad, b.grad, 1e-5, 1e-4)
            a.grad = b.grad = None
        if builds is None:
            builds = cpp_build.BUILDS["count"]
    assert cpp_build.BUILDS["count"] == builds  # later sizes: no new kernels
    src = "".join(open(p).read() for p in cpp_build._LIBS if p.endswith(".cpp"))
    assert "int64_t ks0" in src, "sizes are not kernel arguments"


# ----------------------------------------------------------------------------- the op registry

def _cpp_ir_ops():
    """IR ops that the op-table cases and registry samples compute inside C++ kernels (the schedule
    the C++ renderer gets: ``plan(..., "cpp")``); both sets of graphs run against eager in
    test_cpp.py (test_op_table_cpp, test_registry_sample_cpp) and in the Triton interpreter in
    test_registry.py / test_ops.py."""
    from ember.native import ir
    from ember.native.backend import plan
    from tests.native import test_registry as R
    found = set()
    graphs = []
    for case in R.CASES:
        torch.manual_seed(0)
        inputs = case.make(case.dtypes[0], "cpu")
        graphs.append((R.trace(case.fn, inputs, R.DECOMPOSITIONS), inputs))
    for _, sample, dtype in R.SAMPLES:
        inputs = R.make_inputs(sample, dtype)
        graphs.append((R.trace(sample.fn, inputs, R.SAMPLE_DECOMPOSITIONS), inputs))
    for gm, inputs in graphs:
        _, _, _, emitted = plan(gm, inputs, {}, "cpp")
        for step, _ in emitted:
            found |= {e.op for n in step.nodes if isinstance(n, ir.ComputedNode) for e in ir.walk([n.body])}
    return found


@pytest.fixture(scope="module")
def cpp_ir_ops():
    pytest.importorskip("triton")
    return _cpp_ir_ops()


@pytest.mark.parametrize("op", [op for op in ops.REGISTRY if op.arity is not None], ids=lambda op: op.name)
def test_registry_op_runs_in_cpp_or_is_routed(op, cpp_ir_ops):
    """Every IR op of the registry is computed inside a C++ kernel by some op-table case or sample
    (which test_cpp.py checks against eager), or is routed to ATen on the C++ path by its entry
    (``Op.cpp_aten``, with the reason)."""
    if op.name in ops.CPP_ATEN:
        assert op.name not in cpp_ir_ops, f"{op.name} is routed to ATen on the C++ path but still rendered"
        return
    assert op.name in cpp_ir_ops, f"no op-table case or sample computes {op.name} in a C++ kernel"


@needs_cxx
def test_routed_op_runs_with_aten(native_cache, monkeypatch):
    """An op the registry routes to ATen on the C++ path: its graph runs its ATen code, with the
    op and the reason in ember_native["reason"], and the result is eager's."""
    monkeypatch.setattr(ops, "CPP_ATEN", {"expm1": "a test's reason"})
    x = torch.randn(5, 6)
    compiled = compile_aten_graph(trace(lambda x: torch.expm1(x) * 2, [x]), [x], options={"cache_dir": native_cache})
    assert "expm1" in compiled.ember_native["reason"] and "a test's reason" in compiled.ember_native["reason"]
    compare(compiled(x), torch.expm1(x) * 2)


@needs_cxx
def test_forked_child_builds(native_cache):
    """A child forked after builds ran (the breaks harness forks its workers so) has none of the
    parent's build threads: its own builds must start new ones, not wait forever."""
    x = torch.randn(4, 9)
    compiled = compile_aten_graph(trace(lambda x: x.cos() * 2, [x]), [x], options={"cache_dir": native_cache})
    compare(compiled(x), x.cos() * 2)
    pid = os.fork()
    if pid == 0:  # the child: a new graph, so a new unit to build
        code = 1
        try:
            c = compile_aten_graph(trace(lambda x: x.sin() * 7 - 1, [x]), [x], options={"cache_dir": native_cache})
            code = 0 if torch.allclose(c(x), x.sin() * 7 - 1) else 2
        finally:
            os._exit(code)
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's build hung")
    assert os.waitstatus_to_exitcode(status) == 0
