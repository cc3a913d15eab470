"""max-autotune's tuner (ember/native/autotune.py): candidate configs, the choice and its disk cache
(timings stubbed on CPU), the tuned config and matmul template reaching the wrapper, the Triton
matmul template itself (interpreter), its sm_90 compilation (offline, no GPU), and on a GPU the
real thing."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from ember.native import autotune, compile_aten_graph  # noqa: E402
from ember.native.backend import DEFAULT_OPTIONS, plan  # noqa: E402
from ember.native.options import NativeOptions  # noqa: E402
from ember.native.triton_emit import LaunchConfig  # noqa: E402
from tests.native.harness import DEVICE, compare, trace  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _emitted(fn, inputs, **opts):
    gm = trace(fn, inputs)
    g, _, sched, emitted = plan(gm, inputs, dict(DEFAULT_OPTIONS, **opts))
    return g.buffers(), sched, emitted


# -- candidates -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["pointwise", "persistent", "looped"])
def test_candidates_start_with_the_heuristic_and_keep_the_kernel_valid(case):
    fn, shape = {"pointwise": (lambda x: x.sin() * 2, (1 << 20,)),
                 "persistent": (lambda x: torch.softmax(x, -1), (256, 1000)),
                 "looped": (lambda x: torch.softmax(x, -1), (8, 20000))}[case]
    _, _, emitted = _emitted(fn, [torch.randn(shape)])
    (step, ek), = emitted
    cands = autotune.candidates(ek, step.single, NativeOptions())
    assert cands[0] == ek.config and 1 < len(cands) <= 10
    assert len({(c.XBLOCK, c.RBLOCK, c.num_warps, c.num_stages) for c in cands}) == len(cands)
    for c in cands:
        assert c.persistent == ek.config.persistent
        assert c.XBLOCK & (c.XBLOCK - 1) == 0 and c.num_warps in (1, 2, 4, 8, 16, 32)
        if ek.kind == "per":
            assert c.RBLOCK == ek.config.RBLOCK >= ek.rnumel  # a persistent kernel holds whole rows
        if ek.kind == "poi":
            assert 2 <= c.XBLOCK // (32 * c.num_warps) <= 16 or c == ek.config
    if case == "looped":
        assert any(c.num_stages == 1 for c in cands)


def test_candidates_keep_blocks_that_divide_sizes_whose_masks_were_left_out():
    # 3072 elements, XBLOCK 256: the emitted kernel has no xmask, so 2048 (3072 = 1.5 x 2048) must not be tried
    _, _, emitted = _emitted(lambda x: x.sin() * 2, [torch.randn(3072)])
    (step, ek), = emitted
    assert ek.exact_x and "xmask = tl.full(" in ek.source
    cands = autotune.candidates(ek, step.single, NativeOptions())
    assert {c.XBLOCK for c in cands} == {256, 512, 1024}
    _, _, emitted = _emitted(lambda x: x.sin() * 2, [torch.randn(3000)])
    assert not emitted[0][1].exact_x and "xmask = xindex < xnumel" in emitted[0][1].source


def test_heuristics_keep_rows_up_to_8k_in_registers():
    _, _, emitted = _emitted(lambda x: torch.softmax(x * 0.125, -1), [torch.randn(4, 8192)])
    (_, ek), = emitted
    assert ek.kind == "per" and ek.config == LaunchConfig(1, 8192, 16, True)
    _, _, emitted = _emitted(lambda x: torch.softmax(x, -1), [torch.randn(4, 8193)])
    assert emitted[0][1].kind == "red"
    _, _, emitted = _emitted(lambda x: x * 2, [torch.randn(1 << 20)])
    assert emitted[0][1].config == LaunchConfig(1024, None, 4, False)


# -- the choice and its cache (timings stubbed) -------------------------------------------------------

def _fake_timer(times, calls):
    def time_config(fn, ek, cfg, single, bufs):
        calls.append(cfg)
        return times(cfg)
    return time_config


def test_fastest_candidate_wins_and_is_cached(monkeypatch, tmp_path):
    layouts, sched, emitted = _emitted(lambda x: torch.softmax(x, -1), [torch.randn(64, 1000)])
    (step, ek), = emitted
    calls = []
    # the candidate with the most warps is "fastest"
    monkeypatch.setattr(autotune, "_time_config", _fake_timer(lambda c: 1.0 / c.num_warps, calls))
    best, cached = autotune.tune_kernel(None, ek, step.single, layouts, NativeOptions(), str(tmp_path))
    assert not cached and best.num_warps == max(c.num_warps for c in calls) and len(calls) > 1
    files = list((tmp_path / "native" / "autotune").rglob("*.json"))
    # (after ember.diskcache's one-line envelope header)
    assert len(files) == 1 and json.loads(files[0].read_bytes().partition(b"\n")[2])["num_warps"] == best.num_warps

    def boom(*a):
        raise AssertionError("timed again despite the cache")
    monkeypatch.setattr(autotune, "_time_config", boom)
    again, cached = autotune.tune_kernel(None, ek, step.single, layouts, NativeOptions(), str(tmp_path))
    assert cached and again == best


def test_small_gains_keep_the_heuristic(monkeypatch, tmp_path):
    layouts, _, emitted = _emitted(lambda x: x.cos() + 1, [torch.randn(1 << 16)])
    (step, ek), = emitted
    heuristic = ek.config
    times = lambda c: 1.0 if c == heuristic else 0.99  # noqa: E731 - 1% faster: noise, not a win
    monkeypatch.setattr(autotune, "_time_config", _fake_timer(times, []))
    best, _ = autotune.tune_kernel(None, ek, step.single, layouts, NativeOptions(), str(tmp_path))
    assert best == heuristic


def test_failed_candidates_are_skipped(monkeypatch, tmp_path):
    layouts, _, emitted = _emitted(lambda x: torch.softmax(x, -1), [torch.randn(64, 1000)])
    (step, ek), = emitted
    times = lambda c: None if c.num_warps > 4 else 2.0 / c.XBLOCK  # noqa: E731 - big ones "do not fit"
    monkeypatch.setattr(autotune, "_time_config", _fake_timer(times, []))
    best, _ = autotune.tune_kernel(None, ek, step.single, layouts, NativeOptions(), str(tmp_path))
    assert best.num_warps <= 4


def test_matmul_choice_needs_speed_and_the_same_result(monkeypatch):
    a, b, bias = (torch.randn(40, 24, device=DEVICE), torch.randn(24, 20, device=DEVICE),
                  torch.randn(20, device=DEVICE))
    layouts, sched, _ = _emitted(lambda a, b, bias: torch.addmm(bias, a, b), [a, b, bias])
    from ember.native.ir import ExternNode, BufferArg
    (e,) = [s for s in sched.steps if isinstance(s, ExternNode)]
    tensors = [x for x in e.args if isinstance(x, BufferArg)]
    monkeypatch.setattr(autotune, "mm_candidates", lambda *a: [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
                                                                     num_stages=2, num_warps=2)])
    times = iter([1.0, 0.5])  # cuBLAS, then the template
    monkeypatch.setattr(autotune, "bench_ms", lambda fn: next(times))
    got = autotune._time_matmul("addmm", tensors, {}, e.target, layouts)
    assert got["choice"] == "template" and got["config"]["BLOCK_M"] == 16

    class Wrong(autotune.MMTemplate):
        def __call__(self, *args, **kw):
            return super().__call__(*args, **kw) + 1
    monkeypatch.setattr(autotune, "MMTemplate", Wrong)
    times = iter([1.0, 0.1])
    assert autotune._time_matmul("addmm", tensors, {}, e.target, layouts)["choice"] == "extern"


def test_tuned_configs_and_templates_reach_the_wrapper(monkeypatch, tmp_path):
    """The whole pass with timings stubbed: the wrapper launches the tuned config and calls the
    matmul template, and the result (run in the interpreter) still matches eager."""
    def f(x, w, b):
        return torch.softmax(F.linear(x, w, b), -1) * 2
    inputs = [torch.randn(16, 32, device=DEVICE), torch.randn(48, 32, device=DEVICE), torch.randn(48, device=DEVICE)]
    monkeypatch.setattr(autotune, "skip_reason", lambda device: None)
    monkeypatch.setattr(autotune, "_time_config", _fake_timer(lambda c: 1.0 / (c.num_warps * c.XBLOCK), []))
    tpl = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=2)
    monkeypatch.setattr(autotune, "_time_matmul", lambda *a: {"choice": "template", "ms": 0.1, "config": tpl})
    gm = trace(f, inputs)
    fn = compile_aten_graph(gm, inputs, force_triton=True, options={"autotune": True, "cache_dir": str(tmp_path)})
    src = open(fn.ember_native["wrapper"]).read()
    assert "from ember.native.autotune import MMTemplate" in src and "MMTemplate('addmm'" in src
    compare(fn(*inputs), f(*inputs))


def test_no_timing_without_a_gpu(tmp_path, capsys):
    x = torch.randn(32, 100, device=DEVICE)
    gm = trace(lambda x: torch.softmax(x, -1), [x])
    if DEVICE == "cpu":
        assert autotune.skip_reason("cpu") is not None
    fn = compile_aten_graph(gm, [x], force_triton=True, options={"autotune": True, "cache_dir": str(tmp_path)})
    compare(fn(x), torch.softmax(x, -1))
    if DEVICE == "cpu":
        assert not (tmp_path / "native" / "autotune").exists()


def test_progress_bar(capsys):
    bar = autotune.Progress(3, "kernels")
    bar.step(cached=True)
    bar.step()
    bar.step()
    err = capsys.readouterr().err
    assert "[ember max-autotune]" in err and "3/3 kernels (1 cached" in err and err.endswith("\n")


# -- the matmul template ----------------------------------------------------------------------------

SMALL = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_stages=2, num_warps=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_template_matches_aten(dtype):
    tol = {} if dtype == torch.float32 else dict(atol=0.15, rtol=3e-2)  # fp32: 24-term dots, default tolerances
    a, b = torch.randn(37, 24, dtype=dtype, device=DEVICE), torch.randn(24, 19, dtype=dtype, device=DEVICE)
    bias = torch.randn(19, dtype=dtype, device=DEVICE)
    T = autotune.MMTemplate
    torch.testing.assert_close(T("mm", SMALL)(a, b), a @ b, **tol)
    torch.testing.assert_close(T("addmm", SMALL)(bias, a, b, beta=0.5, alpha=2.0),
                               torch.addmm(bias, a, b, beta=0.5, alpha=2.0), **tol)
    bias2 = torch.randn(37, 1, dtype=dtype, device=DEVICE)
    torch.testing.assert_close(T("addmm", SMALL)(bias2, a, b), torch.addmm(bias2, a, b), **tol)
    A, B = torch.randn(3, 20, 32, dtype=dtype, device=DEVICE), torch.randn(3, 32, 17, dtype=dtype, device=DEVICE)
    torch.testing.assert_close(T("bmm", SMALL)(A, B), torch.bmm(A, B), **tol)  # K a multiple of BLOCK_K
    torch.testing.assert_close(T("mm", SMALL, "gelu")(a, b).float(), F.gelu((a @ b).float()), **tol)
    torch.testing.assert_close(T("mm", SMALL, "relu")(a.t().contiguous().t(), b), torch.relu(a @ b), **tol)


def test_template_and_long_rows_compile_for_sm90():
    """ptxas accepts the template (bf16 and tf32) and an 8K-row persistent softmax with 16 warps."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _OFFLINE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok", out.stdout[-2000:]


_OFFLINE = r'''
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from ember.native.autotune import ember_mm
target = GPUTarget("cuda", 90, 32)
P = {torch.float32: "*fp32", torch.bfloat16: "*bf16"}
for dt, prec, bk in ((torch.bfloat16, "ieee", 64), (torch.float32, "tf32", 32)):
    sig, consts = {}, {}
    vals = dict(K=768, HAS_BIAS=True, ACTIVATION="gelu", INPUT_PRECISION=prec, UPCAST=False, EVEN_K=True,
                BLOCK_M=128, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, STORE_PRE=True)
    for j, a in enumerate(ember_mm.arg_names):
        if j in ember_mm.constexprs:
            sig[a] = "constexpr"; consts[(j,)] = vals[a]
        else:
            sig[a] = P[dt] if a in ("A", "B", "C", "Bias", "Pre") else ("fp32" if a in ("alpha", "beta") else "i32")
    k = triton.compile(triton.compiler.ASTSource(fn=ember_mm, signature=sig, constexprs=consts), target=target,
                       options={"num_warps": 8, "num_stages": 3})
    assert k.metadata.shared <= 232448, k.metadata.shared
from tests.native.gpu_compile_check import compile_kernel
from tests.native.harness import trace
from ember.native.backend import DEFAULT_OPTIONS, plan
import tempfile
x = torch.randn(4, 8192)
gm = trace(lambda x: torch.softmax(x * 0.125, -1), [x])
g, _, _, emitted = plan(gm, [x], dict(DEFAULT_OPTIONS))
with tempfile.TemporaryDirectory() as d:
    for i, (_, ek) in enumerate(emitted):
        assert ek.config.RBLOCK == 8192 and ek.config.num_warps == 16
        compile_kernel(f"k{i}", ek, g.buffers(), target, d)
print("ok")
'''


# -- on a GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_tuned_graphs_match_eager_and_reuse_the_cache(tmp_path, monkeypatch):
    cases = [
        (lambda x: torch.softmax(x * 0.125, -1), [torch.randn(512, 8192, device="cuda")]),
        (lambda x, w, b: F.gelu(F.layer_norm(x, (4096,), w, b)),
         [torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16), torch.randn(4096, device="cuda", dtype=torch.bfloat16),
          torch.randn(4096, device="cuda", dtype=torch.bfloat16)]),
        (lambda x, w, b: F.gelu(F.linear(x, w, b)),
         [torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16), torch.randn(3072, 768, device="cuda", dtype=torch.bfloat16),
          torch.randn(3072, device="cuda", dtype=torch.bfloat16)]),
    ]
    opts = {"autotune": True, "cache_dir": str(tmp_path), "cache": False}
    for f, inputs in cases:
        fn = compile_aten_graph(trace(f, inputs), inputs, options=opts)
        torch.testing.assert_close(fn(*inputs).float(), f(*inputs).float(), atol=6e-2, rtol=2e-2)
    entries = list((tmp_path / "native" / "autotune").rglob("*.json"))
    assert len(entries) >= 4  # 3+ kernels and the matmul
    def boom(*a):
        raise AssertionError("timed again despite the cache")
    monkeypatch.setattr(autotune, "bench_ms", boom)
    monkeypatch.setattr(autotune, "_time_config", boom)
    for f, inputs in cases:  # every decision now comes from the disk cache
        fn = compile_aten_graph(trace(f, inputs), inputs, options=opts)
        torch.testing.assert_close(fn(*inputs).float(), f(*inputs).float(), atol=6e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_template_matches_cublas(tf32, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    for dtype in (torch.float32, torch.bfloat16):
        tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 and not tf32 else dict(atol=0.1, rtol=2e-2)
        for M, N, K in ((1000, 520, 96), (128, 128, 64), (4096, 768, 768)):
            a, b = torch.randn(M, K, device="cuda", dtype=dtype), torch.randn(K, N, device="cuda", dtype=dtype)
            bias = torch.randn(N, device="cuda", dtype=dtype)
            for cfg in autotune.mm_candidates(M, N, K, dtype):
                torch.testing.assert_close(autotune.MMTemplate("addmm", cfg)(bias, a, b), torch.addmm(bias, a, b),
                                           **tol, msg=lambda m: f"{dtype} {M}x{N}x{K} {cfg}: {m}")
        A, B = torch.randn(12, 512, 64, device="cuda", dtype=dtype), torch.randn(12, 64, 512, device="cuda", dtype=dtype)
        torch.testing.assert_close(autotune.MMTemplate("bmm", autotune.mm_candidates(512, 512, 64, dtype)[0])(A, B),
                                   torch.bmm(A, B), **tol)


@pytest.mark.gpu
def test_gpu_max_autotune_no_cudagraphs_model():
    import ember
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024),
                            torch.nn.Linear(1024, 256)).cuda().to(torch.bfloat16).eval()
    c = ember.compile(m, mode="max-autotune-no-cudagraphs")
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(c(x).float(), m(x).float(), atol=6e-2, rtol=2e-2)
