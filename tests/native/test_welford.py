"""var_mean in one pass in Triton's looped reductions (triton_welford) and split as one pair
(split_reduction.split_pair): the statistics match eager, stay accurate on data far from zero (where
E[x^2] - E[x]^2 in fp32 loses every digit), and the data is read by one r-loop only.

Shapes are small (Triton interpreter on CPU); max_rblock forces looped kernels, with RBLOCK dividing
the rows of a chunk (one scalar count per loop) or not (per-lane counts, a masked tail)."""
import re

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from ember.native import backend, ir, split_reduction  # noqa: E402
from tests.native.harness import DEVICE, run_case, trace  # noqa: E402

CL = torch.channels_last
# split_reduction's thresholds lowered as in test_split_reduction: 144 rows of 8 channels split into
# 16 chunks of 9 rows
SPLIT = {"split_reduction_programs": 16, "split_reduction_numel": 64, "single_program_numel": 64,
         "split_outer_rows": 9}
# 576 rows (N=16) in 48 chunks of 12 rows, looped over 3 blocks of 4 rows (RBLOCK divides the chunk)
EXACT = dict(SPLIT, split_outer_rows=12, max_rblock=4)
UNSPLIT = {"split_reduction_programs": 1, "single_program_numel": 64}


def bn_stats(x):
    return torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)


def _plan(fn, inputs, options):
    g, _, sched, emitted = backend.plan(trace(fn, inputs), inputs, dict(backend.DEFAULT_OPTIONS, **options))
    return g, [ek for _, ek in emitted]


def _loops_over(src, ptr) -> int:
    """How many r-loops of a kernel's source load from ``ptr``."""
    return sum(ptr + " +" in body for body in re.split(r"\n    for roffset", src)[1:])


def _stats_input(n=4, c=8, h=6, w=6, mean=0.0, dtype=torch.float32):
    torch.manual_seed(0)
    x = (torch.randn(n, h, w, c, device=DEVICE, dtype=torch.float64) + mean).to(dtype)
    return x.permute(0, 3, 1, 2)  # channels-last [n, c, h, w]


@pytest.mark.parametrize("rblock", [8, 64])  # 8: two loop iterations per chunk of 9 rows; 64: persistent
def test_split_var_mean_is_one_pass(rblock, native_cache):
    """Split as a pair: two kernels (chunks' statistics, their merge), x read by one r-loop."""
    x = _stats_input()
    opts = dict(SPLIT, max_rblock=rblock)
    g, kernels = _plan(bn_stats, [x], opts)
    partials = [n for n in g.nodes if isinstance(n, ir.ComputedNode) and n.name.endswith("_partial")]
    assert [p.ranges for p in partials] == [(16, 9, 8)] * 2
    assert len(kernels) == 2  # partial pair, final merge (and the outputs)
    part = kernels[0]
    if rblock < 9:  # looped, the count per lane (8 does not divide 9): lanes merged by welford_combine
        assert part.kind == "red" and "welford_combine" in part.source
        assert part.source.count("for roffset") == 1 and _loops_over(part.source, "in_ptr0") == 1
    else:  # the chunk's rows in registers: the two-pass spelling reads them once
        assert part.kind == "per" and part.source.count("xmask & rmask, other=0)") == 1
    run_case(bn_stats, [x], options=opts, cache_dir=native_cache, atol=1e-5, rtol=1e-5)


def test_scalar_count_when_rblock_divides_the_chunk(native_cache):
    """EXACT: one count per loop, the lanes merged in two passes over the tile (no welford_combine);
    the result still matches."""
    x = _stats_input(n=16)
    opts = EXACT
    g, kernels = _plan(bn_stats, [x], opts)
    part = kernels[0]
    assert part.config.RBLOCK == 4 and part.rnumel == 12 and part.exact_r, (part.rnumel, part.config)
    assert "_wf0_n_r" in part.source and "welford_combine" not in part.source
    run_case(bn_stats, [x], options=opts, cache_dir=native_cache, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mean", [1e4, 3e5])
@pytest.mark.parametrize("options", [EXACT, dict(SPLIT, max_rblock=8), dict(UNSPLIT, max_rblock=16)],
                         ids=["split-exact", "split-tail", "unsplit"])
def test_large_mean_keeps_accuracy(options, mean, native_cache):
    """Data far from zero (mean + randn, fp32): the naive one-pass E[x^2] - E[x]^2 in fp32 is off by
    more than the variance itself (checked, so the test can tell); Welford on data shifted by a
    first element stays within 1e-6 of the float64 variance (eager: ~5e-8; the two-pass spelling
    this replaced: ~1e-6 at 1e4, 2e-4..2e-3 at 3e5: the rounding of its mean, squared, times n), and
    the mean within one fp32 step."""
    x = _stats_input(n=16, mean=mean)
    var64, mean64 = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
    xf = x.permute(0, 2, 3, 1).reshape(-1, 8)
    naive = (xf * xf).mean(0) - xf.mean(0) ** 2
    assert ((naive.double() - var64).abs() / var64).max() > 0.5  # the naive form fails at this mean
    # eager is the oracle only as far as it is accurate itself (on the H100, ember's variance and
    # eager's differed by 5e-3 relative at mean 3e5): the comparison with eager allows eager's own
    # error, and float64 judges ember's
    eager_err = ((bn_stats(x)[0].double() - var64).abs() / var64).max().item()
    tol = max(1e-4, 2 * eager_err)
    compiled = run_case(bn_stats, [x], options=options, cache_dir=native_cache, atol=tol, rtol=tol)
    var, got_mean = compiled(x)
    assert ((var.double() - var64).abs() / var64).max().item() < 1e-6
    step = 2.0 ** (int(torch.tensor(mean).log2().floor()) - 23)
    assert (got_mean.double() - mean64).abs().max().item() <= step


def test_bf16_input_accumulates_in_fp32(native_cache):
    """bf16 activations (BatchNorm under AMP): read as bf16, statistics in fp32."""
    x = _stats_input(n=16, mean=100.0, dtype=torch.bfloat16)
    opts = EXACT
    _, kernels = _plan(bn_stats, [x], opts)
    assert "tl.zeros([XBLOCK, RBLOCK], tl.float32)" in kernels[0].source
    compiled = run_case(bn_stats, [x], options=opts, cache_dir=native_cache, atol=1e-5, rtol=1e-5)
    var64, _ = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
    assert (compiled(x)[0].double() - var64).abs().max().item() < 1e-5


def test_layer_norm_long_rows_one_loop(native_cache):
    """A row reduction too long for the registers (max_rblock 16 of 100): layer norm's statistics in
    one r-loop, then the normalize loop; forward and backward match."""
    torch.manual_seed(0)
    x = torch.randn(6, 100, device=DEVICE) * 3 + 50
    w, b = torch.randn(100, device=DEVICE), torch.randn(100, device=DEVICE)
    opts = dict(UNSPLIT, max_rblock=16, persistent_rnumel=16)

    def fn(x, w, b):
        return F.layer_norm(x, (100,), w, b)
    _, kernels = _plan(fn, [x, w, b], opts)
    (k,) = [ek for ek in kernels if ek.kind == "red"]
    assert k.source.count("for roffset") == 2 and "_wf0_mean0" in k.source  # statistics, then normalize
    run_case(fn, [x, w, b], options=opts, cache_dir=native_cache, atol=1e-4, rtol=1e-4)

    def fwd_bwd(x, w, b, g):
        y, vjp = torch.func.vjp(lambda x, w, b: F.layer_norm(x, (100,), w, b), x, w, b)
        return (y,) + tuple(vjp(g))
    run_case(fwd_bwd, [x, w, b, torch.randn(6, 100, device=DEVICE)], options=opts, cache_dir=native_cache,
             atol=1e-4, rtol=1e-4)


def test_inf_and_nan_propagate(native_cache):
    """An infinite or NaN element makes the channel's variance NaN, as in eager."""
    x = _stats_input(n=16).contiguous(memory_format=CL)
    x[0, 1, 0, 0] = float("inf")
    x[3, 2, 1, 1] = float("nan")
    compiled = run_case(bn_stats, [x], options=dict(SPLIT, max_rblock=4), cache_dir=native_cache, atol=1e-5,
                        rtol=1e-5)
    var, _ = compiled(x)
    assert var[1].isnan() and var[2].isnan() and not var[0].isnan()


def test_pairs_are_found_only_for_the_lowering_spelling():
    """variance_pairs: B must square x - A / n with A's own body as x and n the reduced count."""
    x = ir.load("x", ir.sym("v0"), {}, torch.float32)
    a_ld = ir.load("A", 0, {}, torch.float32)
    d = ir.op("sub", x, ir.op("truediv", a_ld, ir.const(10, torch.float32)))
    assert split_reduction.variance_pairs({"A": x, "B": ir.op("mul", d, d)}, 10) == {"A": "B"}
    assert split_reduction.variance_pairs({"A": x, "B": ir.op("mul", d, d)}, 11) == {}  # mean over 11
    assert split_reduction.variance_pairs({"A": ir.op("neg", x), "B": ir.op("mul", d, d)}, 10) == {}
    e = ir.op("sub", x, ir.op("truediv", a_ld, ir.const(9, torch.float32)))
    assert split_reduction.variance_pairs({"A": x, "B": ir.op("mul", d, e)}, 10) == {}


def test_cpp_renderer_splits_the_pair_apart():
    """The C++ renderer's split (few long chunks) is unchanged: A and B split on their own."""
    x = torch.empty(32, 64, 112, 112, device="meta").to(memory_format=CL)
    from ember.native import lowering
    g, _ = lowering.lower(trace(bn_stats, [x]), [x])
    names = [n.name for n in split_reduction.split_reductions(g, backend.NativeOptions(), "cpp").nodes]
    assert names.index("buf0") < names.index("buf1_partial")  # B's chunks read A's final value


# ---- the kernels compile for a real GPU (sm_90, offline: gpu_compile_check.compile_kernel) ----------
def _compile_cases():
    x = _stats_input(n=16).contiguous(memory_format=CL)
    resnet = torch.empty(64, 256, 56, 56, device="meta", dtype=torch.bfloat16).to(memory_format=CL)
    ln_opts = dict(UNSPLIT, max_rblock=16, persistent_rnumel=16)
    return [("exact", bn_stats, [x], EXACT), ("tail", bn_stats, [x], dict(SPLIT, max_rblock=8)),
            ("f64", lambda x: torch.var_mean(x, (0, 2, 3)), [x.double()], dict(SPLIT, max_rblock=8)),
            ("resnet", bn_stats, [resnet], {}),
            ("layer_norm", lambda x, w: F.layer_norm(x, (100,), w), [torch.randn(6, 100), torch.randn(100)], ln_opts)]


def _compile_for_sm90():
    import tempfile

    from triton.backends.compiler import GPUTarget

    from tests.native.gpu_compile_check import compile_kernel
    welford = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn, inputs, opts in _compile_cases():
            g, kernels = _plan(fn, inputs, opts)
            for i, ek in enumerate(kernels):
                compile_kernel(f"{name}_{i}", ek, g.buffers(), GPUTarget("cuda", 90, 32), tmp)
                welford += "_wf0_mean0" in ek.source
    print(welford)


def test_welford_kernels_compile_for_sm90():
    """The interpreter accepts what Triton's compiler may not (loop-carried values must keep their
    type and shape): every Welford variant compiles for sm_90 (a subprocess without TRITON_INTERPRET)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", "from tests.native.test_welford import _compile_for_sm90 as f; f()"],
                         env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip().splitlines()[-1]) == 5  # one Welford kernel per case


PAIR_CASES = {  # name -> (fn, shape, split as a pair?)
    "all": (lambda x: torch.var_mean(x), (64, 50), True),                            # no kept dim: scalars
    "rows": (lambda x: torch.var_mean(x, 1, correction=0, keepdim=True), (3, 1024), True),  # contiguous rows
    "std_dims": (lambda x: torch.std(x, (0, 2)), (48, 3, 40), True),                 # two reduced loops
    "prime": (lambda x: torch.var_mean(x, 1), (3, 1031), False),                     # no equal chunks: apart
}


@pytest.mark.parametrize("name", list(PAIR_CASES))
@pytest.mark.parametrize("rblock", [8, 64])
def test_pair_split_shapes(name, rblock, native_cache):
    """Pairs over other shapes split as one (or apart, where equal chunks do not exist) and match eager,
    on data far from zero."""
    fn, shape, paired = PAIR_CASES[name]
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE) + 1e3
    opts = dict(SPLIT, max_rblock=rblock)
    g, _ = _plan(fn, [x], opts)
    names = [n.name for n in g.nodes]
    assert any(s.endswith("_partial") for s in names)
    assert any(s.endswith("_shifted") for s in names) == paired, names
    run_case(fn, [x], options=opts, cache_dir=native_cache, atol=1e-4, rtol=1e-4)


def test_a_pair_reading_a_value_of_its_own_kernel_runs_unshifted():
    """x computed by another node of the same kernel (the Stable Diffusion UNet's GroupNorm of a skip
    concatenation it also stores): that node's code reads the loop's r-indices, which do not exist
    before the loop, so the shift ``k`` cannot be read there; the pair runs unshifted (the H100 compile
    failed with "v2 is not defined" before). A pair of plain loads still gets its shift."""
    import types

    import sympy

    from ember.native import ir, triton_welford

    r0 = sympy.Symbol("v0")
    emitted = []

    def value(e, scope):
        emitted.append(e)
        return "x0"

    def emit_line(scope, code):
        scope.lines.append(code)
        return f"t{len(scope.lines)}"
    for buf, in_kernel in (("buf1", True), ("arg0", False)):
        body = ir.Expr("load", (), torch.float32, (buf, r0, ()))
        k = types.SimpleNamespace(reduced=[0], bodies={"a": body}, rnumel=64)
        em = types.SimpleNamespace(k=k, vars=[r0], nodes={"buf1"}, value=value, emit_line=emit_line)
        st = triton_welford.StageWelford.__new__(triton_welford.StageWelford)
        st.em, st.names, st.shift = em, ["a"], {}
        top = types.SimpleNamespace(lines=[])
        emitted.clear()
        st.shifts(top)
        if in_kernel:
            assert st.shift["a"] == "0.0" and not emitted and not top.lines
        else:
            assert st.shift["a"] != "0.0" and emitted and emitted[0].attr[1] == 0  # read at r = 0
