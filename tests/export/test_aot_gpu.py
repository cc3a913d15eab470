"""CUDA AOT packages: ember's Triton kernels and their binaries in the package; a fresh process loads
it and runs every batch size of the package's range without compiling anything: Triton's compiler is
patched to raise, each launch site gets its kernel straight from the packaged binary (``CompiledKernel``,
no JIT), and no frontend/compiler module is imported. Prints import / load / first call separately."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

import ember.export as ee
from tests.export.models import HAS, build

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent("""
    import sys, time
    t0 = time.perf_counter()
    import torch
    import triton, triton.compiler.compiler as tcc
    from triton.runtime.jit import JITFunction
    def no_compile(*a, **k):
        raise AssertionError("Triton compiled a kernel while loading or running an AOT package")
    tcc.compile = triton.compile = no_compile
    jit_runs = []
    real_run = JITFunction.run
    def counted_run(self, *a, **k):
        jit_runs.append(self.__name__)
        return real_run(self, *a, **k)
    JITFunction.run = counted_run
    from ember.export import aot_load
    if sys.argv[3] != "None":
        __import__(sys.argv[3])
    inputs, expected = torch.load(sys.argv[1])
    t1 = time.perf_counter()
    run = aot_load(sys.argv[2])
    t2 = time.perf_counter()
    for i, (args, want) in enumerate(zip(inputs, expected)):
        got = run(*[a.cuda() for a in args])
        got = got.last_hidden_state if hasattr(got, "last_hidden_state") else got
        if i == 0:
            torch.cuda.synchronize()
            t3 = time.perf_counter()
        torch.testing.assert_close(got.cpu(), want, rtol=float(sys.argv[4]), atol=float(sys.argv[4]))
    heavy = sorted(m for m in sys.modules if m.startswith(("ember.frontend", "ember.api", "ember.aot",
                   "ember.native.lowering", "ember.native.scheduler", "ember.native.triton_emit",
                   "ember.native.backend", "torch._dynamo", "torch._inductor")))
    assert not heavy, heavy
    info = getattr(run._run, "ember_aot", None)
    print(f"cuda aot ok import {t1 - t0:.3f} load {t2 - t1:.3f} first {t3 - t2:.3f} batches {len(inputs)} "
          f"kernels {info} jit_runs {len(jit_runs)}")
""")


@pytest.mark.parametrize("name", ["tiny_resnet", "gpt2", "resnet50"])
def test_cuda_package_fresh_process(name, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    need = {"gpt2": "transformers", "resnet50": "torchvision"}.get(name)
    if need and not HAS[need]:
        pytest.skip(f"{need} is not installed")
    model, make_args, pick = build(name)
    model = model.cuda()
    inputs = [make_args(b) for b in (2, 3, 5, 8)]
    with torch.no_grad():
        expected = [pick(model(*[a.cuda() for a in args])).cpu() for args in inputs]
    first = "input_ids" if name == "gpt2" else "x"
    ep = ee.export(model, tuple(a.cuda() for a in inputs[0]), dynamic_shapes={first: {0: ee.Dim("batch", max=8)}})
    ee.aot_compile(ep, str(tmp_path / "m.ember"), device="cuda")
    with zipfile.ZipFile(tmp_path / "m.ember") as zf:
        names = zf.namelist()
        native = json.loads(zf.read("manifest.json"))["native"]
    assert any(n.startswith("native/kernels/") for n in names), names
    assert any(n.startswith("native/triton_cache/") for n in names), names
    # one wrapper for every batch size: symbolic, not compiled per size
    assert "s0 = arg" in native["sizes"] and "range [2, 8]" in native["sizes"], native["sizes"]
    assert native["launches"], "no launch site recorded its compiled kernel"
    torch.save((inputs, expected), tmp_path / "io.pt")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TRITON_CACHE_DIR", None)
    out_mod = "transformers.modeling_outputs" if name == "gpt2" else "None"
    # ResNet-50: 50 layers of TF32 convolutions (cuDNN's default for fp32), whose algorithm choice
    # differs between processes, put single outputs ~1e-2 apart (eager against itself does the same)
    tol = "1e-2" if name == "resnet50" else "2e-3"
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "io.pt"), str(tmp_path / "m.ember"), out_mod, tol],
                         capture_output=True, text=True, env=env, timeout=600)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cuda aot ok" in res.stdout
    # every kernel came straight from its packaged binary: Triton's JIT never ran
    assert "'kernels_jit': 0" in res.stdout and "jit_runs 0" in res.stdout, res.stdout
    if name == "tiny_resnet":  # a package for another Triton is refused, naming it
        with zipfile.ZipFile(tmp_path / "m.ember") as src, zipfile.ZipFile(tmp_path / "t.ember", "w") as dst:
            for n in src.namelist():
                data = src.read(n)
                if n == "manifest.json":
                    m = json.loads(data)
                    m["environment"]["triton"] = "0.0"
                    data = json.dumps(m).encode()
                dst.writestr(n, data)
        with pytest.raises(ee.PackageMismatch, match=r"built for triton='0.0'"):
            ee.aot_load(str(tmp_path / "t.ember"))


@pytest.mark.xfail(reason="on the H100 (Triton 3.6) a dynamic graph's wrapper makes a launch site per new batch "
                   "size for these kernels instead of a DynamicLaunch grid: Triton's JIT runs once per size (a "
                   "cache hit, no compile; results correct). Seen 2026-11-26, .devrun/dyn_probe.py", strict=False)
def test_new_batch_sizes_reuse_the_compiled_kernels():
    """ember.compile with dynamic shapes: a batch size met for the first time launches the kernels
    compiled for the first one (DynamicLaunch adopts them), with no Triton JIT run, and matches eager."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import ember
    from triton.runtime.jit import JITFunction
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).cuda()
    f = ember.compile(m, dynamic=True)
    with torch.no_grad():
        f(torch.randn(4, 64, device="cuda"))
        f(torch.randn(5, 64, device="cuda"))  # (the frontend's dynamic recompile, if any, happens here)
        runs, real = [], JITFunction.run

        def counted(self, *a, **k):
            runs.append(self.__name__)
            return real(self, *a, **k)
        JITFunction.run = counted
        try:
            for b in (7, 33, 100):
                x = torch.randn(b, 64, device="cuda")
                torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-4)
        finally:
            JITFunction.run = real
    assert not runs, runs
