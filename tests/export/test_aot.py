"""AOT packages: aot_compile writes one file (wrapper, weights, manifest); aot_load runs it with no
tracing, FX or compiling, importing only the small runtime, and refuses a package built elsewhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import ember.export as ee
from tests.export.test_export import Counter

REPO = Path(__file__).resolve().parents[2]
# what loading a package must never import: ember's frontend and compilers, torch's (and Triton on CPU)
HEAVY = ("ember.frontend", "ember.api", "ember.aot", "ember.backends", "ember.native.lowering",
         "ember.native.scheduler", "ember.native.backend", "ember.native.cpp_emit", "ember.native.triton_emit",
         "ember.native.symbolic", "ember.native.build_pool", "torch._dynamo", "torch._inductor", "triton")


@pytest.fixture
def package(tmp_path):
    m = Counter()
    ep = ee.export(m, (torch.randn(5, 4), torch.ones(2)), dynamic_shapes={"x": {0: ee.Dim("batch", max=64)}})
    path = ee.aot_compile(ep, str(tmp_path / "counter.ember"), device="cpu")
    return m, path


def test_package_is_one_file_with_readable_wrapper(package):
    _, path = package
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        wrapper = zf.read("wrapper.py").decode()
        manifest = json.loads(zf.read("manifest.json"))
    assert {"manifest.json", "wrapper.py", "weights.bin"} <= names
    assert wrapper.startswith("# ember AOT wrapper for counter")
    assert "torch.ops.aten.addmm.default" in wrapper
    env = manifest["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["cpu_features"]
    assert manifest["ranges"] and list(manifest["ranges"].values())[0] == [2, 64]


def test_aot_load_matches_eager_with_mutations(package):
    m, path = package
    ref = Counter()
    ref.load_state_dict(m.state_dict())
    run = ee.aot_load(path)
    for b in (2, 7, 64):
        x = torch.randn(b, 4)
        a1, a2 = torch.ones(2), torch.ones(2)
        torch.testing.assert_close(run(x, a1), ref(x, a2))
        torch.testing.assert_close(a1, a2)
    assert run._weights[2].item() == ref.count.item() == 3   # the buffer is carried across calls
    with pytest.raises(ValueError, match=r"x.size\(0\) = 65 is outside the range"):
        run(torch.randn(65, 4), torch.ones(2))
    with pytest.raises(ValueError, match=r"x.size\(1\) is 5, but the package was exported for 4"):
        run(torch.randn(3, 5), torch.ones(2))
    with pytest.raises(ValueError, match="structured as"):
        run(torch.randn(3, 4))
    # the kernels take raw addresses: an input on another device is an error, not a memory fault
    with pytest.raises(ValueError, match=r"x is on meta, but the package runs on cpu: move it there first"):
        run(torch.randn(3, 4, device="meta"), torch.ones(2))


def _rewrite_manifest(path, tmp_path, **env):
    out = tmp_path / "tampered.ember"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "manifest.json":
                manifest = json.loads(data)
                manifest["environment"].update(env)
                data = json.dumps(manifest).encode()
            dst.writestr(name, data)
    return str(out)


def test_refuses_other_torch_or_cpu(package, tmp_path):
    _, path = package
    with pytest.raises(ee.PackageMismatch, match=r"built for torch='1.0.0' but this process has torch="):
        ee.aot_load(_rewrite_manifest(path, tmp_path, torch="1.0.0"))
    with pytest.raises(ee.PackageMismatch, match="cpu_features"):
        ee.aot_load(_rewrite_manifest(path, tmp_path, cpu_features="NEON", native_cpu_code=True))
    with pytest.raises(ee.PackageMismatch, match="no CUDA device" if not torch.cuda.is_available() else "triton"):
        ee.aot_load(_rewrite_manifest(path, tmp_path, device="cuda", triton="0.0"))


def test_loading_imports_only_the_runtime(package):
    """A fresh process: import, load and first call separately; no frontend, FX tracer or compiler
    (the C++ package's wrapper imports only ember.native's small runtime modules)."""
    _, path = package
    script = (
        "import sys, torch\n"
        "from ember.export import aot_load\n"
        "run = aot_load(sys.argv[1])\n"
        "print(run(torch.randn(3, 4), torch.ones(2))['y'].shape)\n"
        f"heavy = sorted(m for m in sys.modules if m.startswith({HEAVY!r}))\n"
        "print('heavy', heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "torch.Size([3, 3])" in res.stdout
    assert "heavy []" in res.stdout, res.stdout


def test_triton_package_under_the_interpreter(tmp_path):
    """The Triton package path (kernels built in a child process, relocated, loaded by ember's native
    wrapper) on CPU, where Triton's interpreter runs the kernels: the CUDA path minus the binaries."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    ep = ee.export(m, (torch.randn(4, 8),), dynamic_shapes={"input": {0: ee.Dim("batch", max=32)}})
    path = ee.aot_compile(ep, str(tmp_path / "tri.ember"), device="cpu", kernels="triton")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        graph = zf.read("native/graph.py").decode()
    assert any(n.startswith("native/kernels/") for n in names), names
    assert "load_kernel(" in graph
    script = (
        "import sys, torch\n"
        "from ember.export import aot_load\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))\n"
        "run = aot_load(sys.argv[1])\n"
        "for b in (3, 4, 17):\n"
        "    x = torch.randn(b, 8)\n"
        "    torch.testing.assert_close(run(x), m(x), rtol=1e-4, atol=1e-4)\n"
        "print('native', type(run._run).__name__, sorted(k for k in sys.modules if k.startswith('ember_native_')))\n"
        "heavy = sorted(k for k in sys.modules if k.startswith(('ember.frontend', 'ember.api', 'ember.aot',\n"
        "    'ember.native.lowering', 'ember.native.scheduler', 'ember.native.triton_emit')))\n"
        "print('heavy', heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ember_native_" in res.stdout and "heavy []" in res.stdout, res.stdout


# ---------------------------------------------------------------------------------- C++ packages

NO_COMPILING = r'''
import builtins, subprocess, sys, time
t0 = time.perf_counter()
import torch
import torch.fx, torch.fx.experimental.proxy_tensor as proxy_tensor

def forbidden(what):
    def raiser(*a, **k):
        raise AssertionError(f"{what} ran while loading or calling an AOT package")
    return raiser
# no FX work, no tracing, no compiler or other subprocess, no frontend/compiler imports
torch.fx.Tracer.trace = forbidden("torch.fx.Tracer.trace")
torch.fx.GraphModule.__init__ = forbidden("torch.fx.GraphModule()")
torch.fx.Graph.__init__ = forbidden("torch.fx.Graph()")
proxy_tensor.make_fx = forbidden("make_fx")
subprocess.Popen.__init__ = forbidden("a subprocess (a compiler)")
sys.settrace, sys.setprofile = forbidden("sys.settrace"), forbidden("sys.setprofile")
real_import = builtins.__import__
HEAVY = %r
def guarded_import(name, *args, **kwargs):
    if name.startswith(HEAVY):
        raise AssertionError(f"import of {name} while loading an AOT package")
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded_import
t1 = time.perf_counter()
from ember.export import aot_load
run = aot_load(sys.argv[1])
t2 = time.perf_counter()
x = torch.randn(int(sys.argv[2]), 8)
y = run(x)
t3 = time.perf_counter()
torch.save((x, y), sys.argv[3])
heavy = sorted(m for m in sys.modules if m.startswith(HEAVY))
print("native", type(run._run).__name__, "heavy", heavy)
print(f"timing import {t1 - t0:.3f} load {t2 - t1:.3f} first {t3 - t2:.3f}")
''' % (HEAVY + ("sympy",),)  # (sympy: the native lowering; a model's own imports may pull it in)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


@pytest.fixture(scope="module")
def cpp_package(tmp_path_factory):
    from ember.native import cpp_build
    if cpp_build.problem() is not None:
        pytest.skip("no working C++ compiler")
    m = _mlp().eval()
    ep = ee.export(m, (torch.randn(4, 8),), dynamic_shapes={"input": {0: ee.Dim("batch", min=2, max=64)}})
    path = ee.aot_compile(ep, str(tmp_path_factory.mktemp("cpp") / "mlp.ember"), device="cpu")  # default: C++
    return m, path


def test_cpu_package_holds_the_cpp_kernels_built(cpp_package):
    _, path = cpp_package
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        manifest = json.loads(zf.read("manifest.json"))
        graph = zf.read("native/graph.py").decode()
    native = manifest["native"]
    assert native["renderer"] == "cpp" and native["binaries"]
    for unit, so in native["binaries"].items():
        assert f"native/kernels/{unit}" in names and f"native/kernels/{so}" in names
    assert "load_cpp_kernel(" in graph
    # one wrapper for every batch size: the size is read from the input and passed to the kernels
    assert "s0 = arg" in graph and "range [2, 64]" in native["sizes"]
    env = manifest["environment"]
    assert env["native_cpu_code"] is True and env["cpu_flags"] == ee_runtime().cpu_flags()


def ee_runtime():
    import ember.export.aot_runtime as rt
    return rt


@pytest.mark.parametrize("batch", [2, 5, 64])
def test_cpp_package_loads_without_compiling_tracing_or_the_frontend(cpp_package, batch, tmp_path):
    """A fresh process where FX, make_fx, tracing hooks, subprocesses (a compiler) and the
    frontend/compiler modules all raise: the package loads and runs every batch size of its range."""
    m, path = cpp_package
    env = dict(os.environ, PYTHONPATH=str(REPO), CXX="/nonexistent/c++", PATH="/nonexistent")
    out = tmp_path / "out.pt"
    res = subprocess.run([sys.executable, "-c", NO_COMPILING, path, str(batch), str(out)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "native function heavy []" in res.stdout, res.stdout
    x, y = torch.load(out)
    with torch.no_grad():
        torch.testing.assert_close(y, m(x), rtol=1e-5, atol=1e-5)


def test_no_compiling_check_can_fail(cpp_package, tmp_path):
    """The guard above is live: loading through the compiling path (ember.compile) trips it."""
    script = NO_COMPILING.replace("from ember.export import aot_load", "import ember\naot_load = lambda p: ember.compile(torch.nn.Linear(8, 4))")
    res = subprocess.run([sys.executable, "-c", script, cpp_package[1], "3", str(tmp_path / "o.pt")],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert res.returncode != 0 and "AssertionError" in res.stderr and "while loading" in res.stderr


def test_cpp_package_refuses_a_cpu_without_its_features(cpp_package, tmp_path):
    _, path = cpp_package
    with zipfile.ZipFile(path) as zf:
        flags = json.loads(zf.read("manifest.json"))["environment"]["cpu_flags"]
    if not flags:
        pytest.skip("this platform does not list CPU flags")
    with pytest.raises(ee.PackageMismatch, match=r"features this CPU lacks \(avx9000\).*rebuild"):
        ee.aot_load(_rewrite_manifest(path, tmp_path, cpu_flags=flags + ["avx9000"]))
    # an ATen-only package runs on any CPU of the same torch: its flags are not checked
    ep = ee.export(_mlp(), (torch.randn(4, 8),))
    aten = ee.aot_compile(ep, str(tmp_path / "aten.ember"), device="cpu", kernels="aten")
    assert "native" not in json.loads(zipfile.ZipFile(aten).read("manifest.json"))
    ee.aot_load(_rewrite_manifest(aten, tmp_path, cpu_flags=flags + ["avx9000"]))


def test_weights_are_mapped_not_copied(cpp_package):
    _, path = cpp_package
    from ember.export.weights import ALIGN, data_offset
    assert data_offset(path) % ALIGN == 0
    run = ee.aot_load(path)
    for w in run._weights:
        assert w.data_ptr() % ALIGN == 0 and not w.untyped_storage().resizable()  # a view of the mapping
    with open(path, "rb") as f:
        before = f.read()
    with torch.no_grad():
        run._weights[0].add_(1.0)  # copy-on-write: the process's pages change, the file does not
    with open(path, "rb") as f:
        assert f.read() == before
