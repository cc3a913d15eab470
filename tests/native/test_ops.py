"""Every case of the op table, compiled to Triton and compared with eager (see harness.py)."""
import pytest
import torch

pytest.importorskip("triton")

from tests.native.harness import DEVICE, run_case  # noqa: E402
from tests.native.optable import OPS, f32  # noqa: E402

# tiny blocks: several programs per launch and several iterations of each reduction loop
SMALL_BLOCKS = {"max_xblock": 8, "max_rblock": 8}

PARAMS = [pytest.param(c, dt, {}, id=f"{c.name}-{str(dt).replace('torch.', '')}") for c in OPS for dt in c.dtypes]
PARAMS += [pytest.param(c, f32, SMALL_BLOCKS, id=f"{c.name}-looped") for c in OPS if c.looped]


@pytest.mark.parametrize("case,dtype,options", PARAMS)
def test_op(case, dtype, options, native_cache):
    torch.manual_seed(0)
    inputs = case.make(dtype, DEVICE)
    tol = {"atol": case.atol, "rtol": case.rtol} if dtype == f32 else {}
    compiled = run_case(case.fn, inputs, options=options, cache_dir=native_cache, check_strides=case.strides, **tol)
    report = compiled.ember_native["report"]
    if case.kernels is not None and not options:
        assert report["kernels"] == case.kernels, report
    if case.externs is not None:
        assert report["externs"] == case.externs, report


# ---------------------------------------------------------------------------- symbolic sizes
# The same cases traced with every dimension >= 2 symbolic (dynamic shapes): kernels take their
# sizes as arguments. These few fall back to per-size kernels, on purpose: the bounds below are not
# provable for every size.
SYMBOLIC_FALLBACKS = {
    "diagonal": "Min(13, s0): the diagonal's length depends on which dimension is shorter",
    "split_chunk": "where the third chunk starts is not provably inside the dimension",
    "group_norm": "as_strided over a view whose size needs the divisibility of C by the groups",
    "conv_relu": "the output size Max(1, ...) of a convolution over symbolic spatial sizes",
    "conv_args": "the same, with stride and dilation",
    "batch_norm_train_stats": "the running variance's n / (n - 1) is a symbolic float",
    "scatter_neg_slices": "a negative start (s1 - 30) with a step is not provably inside the dimension",
}
SYMBOLIC_QUICK = {"add_bcast", "mul_outer", "noncontig_in", "transpose_out", "permute3", "expand_add", "slice_step",
                  "select_narrow", "reshape_chain", "flip", "repeat", "sum_d0", "sum_d02", "sum_all", "mean",
                  "max_dim", "argmax", "var_mean", "logsumexp", "softmax_dim0", "softmax_mid", "log_softmax",
                  "layer_norm", "batch_norm_train", "cross_entropy", "linear_relu", "attention_math", "cat",
                  "stack", "pad", "index_of_pad", "tril_triu", "embedding", "gather", "index_adv", "slice_scatter",
                  "select_scatter", "arange_ops", "inplace_ops", "input_mutation"} | set(SYMBOLIC_FALLBACKS)
SYMBOLIC = [pytest.param(c, id=c.name, marks=() if c.name in SYMBOLIC_QUICK else pytest.mark.slow) for c in OPS]


@pytest.mark.parametrize("case", SYMBOLIC)
def test_op_symbolic(case):
    from ember.native import compile_aten_graph
    from tests.native.harness import compare, guarded, padded, trace
    torch.manual_seed(0)
    inputs = [padded(x) for x in case.make(f32, DEVICE)]
    ref = case.fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    gm = trace(case.fn, inputs, "symbolic")
    compiled = compile_aten_graph(gm, inputs, force_triton=True, options={"cache": False, **SMALL_BLOCKS})
    reason = compiled.ember_native["reason"]
    assert (reason is None) == (case.name not in SYMBOLIC_FALLBACKS), reason
    with guarded(compiled) as alloc:
        out = compiled(*inputs)
    if alloc is not None:
        alloc.check()
    compare(out, ref, case.atol, case.rtol, check_strides=case.strides)
