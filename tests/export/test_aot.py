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
    assert {"manifest.json", "wrapper.py", "weights.pt"} <= names
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
    """A fresh process: import, load and first call separately; no frontend, FX tracer or compiler."""
    _, path = package
    script = (
        "import sys, torch\n"
        "from ember.export import aot_load\n"
        "run = aot_load(sys.argv[1])\n"
        "print(run(torch.randn(3, 4), torch.ones(2))['y'].shape)\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('ember.frontend', 'ember.api', 'ember.aot',\n"
        "    'ember.native', 'ember.backends', 'triton')))\n"
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
