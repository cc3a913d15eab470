"""CUDA AOT packages: ember's Triton kernels and their binaries in the package; a fresh process loads
it, runs it without compiling anything (the Triton cache it finds is the package's) and matches eager."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ember.export as ee
from tests.export.models import HAS, build

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent("""
    import sys, time, torch
    t0 = time.perf_counter()
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
        torch.testing.assert_close(got.cpu(), want, rtol=2e-3, atol=2e-3)
        if i == 0:
            torch.cuda.synchronize()
            t3 = time.perf_counter()
    heavy = sorted(m for m in sys.modules if m.startswith(("ember.frontend", "ember.api", "ember.aot",
                   "ember.native.lowering", "ember.native.scheduler", "ember.native.triton_emit")))
    assert not heavy, heavy
    print(f"cuda aot ok import {t1 - t0:.3f} load {t2 - t1:.3f} first {t3 - t2:.3f}")
""")


@pytest.mark.parametrize("name", ["tiny_resnet", "gpt2"])
def test_cuda_package_fresh_process(name, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if name == "gpt2" and not HAS["transformers"]:
        pytest.skip("transformers is not installed")
    model, make_args, pick = build(name)
    model = model.cuda()
    inputs = [make_args(b) for b in (2, 3, 5)]
    with torch.no_grad():
        expected = [pick(model(*[a.cuda() for a in args])).cpu() for args in inputs]
    first = "input_ids" if name == "gpt2" else "x"
    ep = ee.export(model, tuple(a.cuda() for a in inputs[0]), dynamic_shapes={first: {0: ee.Dim("batch", max=8)}})
    ee.aot_compile(ep, str(tmp_path / "m.ember"), device="cuda")
    import zipfile
    names = zipfile.ZipFile(tmp_path / "m.ember").namelist()
    assert any(n.startswith("native/kernels/") for n in names), names
    assert any(n.startswith("native/triton_cache/") for n in names), names
    torch.save((inputs, expected), tmp_path / "io.pt")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TRITON_CACHE_DIR", None)
    out_mod = "transformers.modeling_outputs" if name == "gpt2" else "None"
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "io.pt"), str(tmp_path / "m.ember"), out_mod],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cuda aot ok" in res.stdout
    print(res.stdout)
