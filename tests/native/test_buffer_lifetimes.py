"""Buffer lifetimes in the generated wrapper (peak memory of training steps, issue 28): a dead buffer
that no later allocation reuses is freed where it dies, not at the return; with ``release_inputs``
(the ember backend's backward graphs) the wrapper takes its inputs boxed and drops each at its last
use. benchmarks/probes/train_memory.py measures a GPT-2 step's peak with an exact live-bytes counter."""
import os
import subprocess
import sys
import weakref

import pytest
import torch

pytest.importorskip("triton")

from ember.native import compile_aten_graph  # noqa: E402
from ember.native.cache import load_module  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402


def _graph(x, w):
    h = (x.sin() * 2) @ w          # kernel, then an extern matmul
    g = (h.relu() + 1).sum(0)      # a reduction to a smaller buffer
    return (g.unsqueeze(0) * h).cos()


def _compile(tmp_path, release):
    args = [torch.randn(64, 32, device=DEVICE), torch.randn(32, 48, device=DEVICE)]
    gm = trace(_graph, args)
    fn = compile_aten_graph(gm, args, force_triton=True,
                            options={"cache_dir": str(tmp_path), "release_inputs": release})
    return fn, args


def test_released_inputs_die_at_their_last_use(tmp_path):
    fn, args = _compile(tmp_path, True)
    src = open(fn.ember_native["wrapper"]).read()
    assert "# (inputs: last use)" in src and "args.clear()" in src
    mod = load_module(fn.ember_native["wrapper"])
    x = args[0].clone()
    dead = []
    weakref.finalize(x.untyped_storage(), dead.append, True)
    seen = []
    real = mod.empty_strided

    def alloc(*a, **k):
        seen.append(bool(dead))
        return real(*a, **k)
    mod.empty_strided = alloc
    try:
        box = [x, args[1]]
        del x
        out = fn.boxed(box)
    finally:
        mod.empty_strided = real
    assert box == []  # the boxed convention: the callee empties the list
    assert dead and seen and seen[-1], "x was still alive at the last allocation (after its last use)"
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0)  # the positional form: the same code
    torch.testing.assert_close(out, _graph(*args), rtol=1e-3, atol=1e-2)  # (sums of 64 products: fp32 order)


def test_without_release_the_wrapper_is_positional(tmp_path):
    fn, args = _compile(tmp_path, False)
    src = open(fn.ember_native["wrapper"]).read()
    assert "def run(" not in src and "(inputs: last use)" not in src and not hasattr(fn, "boxed")
    torch.testing.assert_close(fn(*args), _graph(*args), rtol=1e-3, atol=1e-2)


def test_no_dead_buffer_waits_for_the_return(tmp_path):
    """Every buffer the wrapper allocates is reused, returned, or deleted before the return."""
    fn, _ = _compile(tmp_path, False)
    body = open(fn.ember_native["wrapper"]).read().split("def call(")[1].splitlines()
    allocated = [l.split("=")[0].strip() for l in body if "empty_strided(" in l]
    ret = next(l for l in body if l.strip().startswith("return ") and "fallback" not in l)
    for buf in allocated:
        freed = any(l.strip().startswith("del ") and buf in l.replace(",", " ").split() for l in body)
        reused = any(f"= {buf}; del {buf}" in l or f"as_strided({buf}," in l for l in body)
        assert freed or reused or buf in ret, f"{buf} lives until the return:\n" + "\n".join(body)


@pytest.mark.slow
def test_gpt2_step_peak_below_eager(tmp_path):
    """A 2-layer GPT-2 step on CPU (Triton interpreter): ember's peak live bytes under eager's."""
    import json
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path), PYTHONPATH=root)
    out = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "probes", "train_memory.py"), "--device",
                          "cpu"], env=env, capture_output=True, text=True, timeout=1200)
    line = next(l for l in out.stdout.splitlines() if l.startswith("TRAIN_MEMORY "))
    d = json.loads(line[len("TRAIN_MEMORY "):])
    assert d["ember"]["peak_live_bytes"] < d["eager"]["peak_live_bytes"], d
