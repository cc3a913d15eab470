"""The native backend's graph passes (ember/native/passes.py): CSE, and matmuls with sizes cuBLAS
cannot align padded (pad_mm.py); both still match eager.
An output that is the padded product keeps its padded row stride, as with torch.compile."""
import pytest
import torch

from ember.native import pad_mm
from tests.native.harness import DEVICE, run_case, trace

PAD_ALWAYS = {"pad_mm_min_flops": 0, "small_mm_flops": 0}  # the cuBLAS path: no Triton matmul


def _padded_nodes(fn, inputs):
    gm = trace(fn, inputs)
    n = pad_mm.pad_matmuls(gm, 0, on_cpu=True)
    return n, [node.target for node in gm.graph.nodes if node.op == "call_function"]


@pytest.mark.parametrize("m,k,n", [(12, 16, 13), (13, 16, 16), (16, 13, 16), (9, 11, 13)])
def test_mm_misaligned_dims(m, k, n):
    a = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=DEVICE, dtype=torch.bfloat16)
    out = run_case(lambda a, b: a @ b, [a, b], options=PAD_ALWAYS, check_strides=False)(a, b)
    assert out.stride() == ((n + 7) // 8 * 8, 1) if n % 8 else out.is_contiguous()
    count, targets = _padded_nodes(lambda a, b: a @ b, [a, b])
    assert count == 1 and torch.ops.aten.constant_pad_nd.default in targets


def test_lm_head_shape_intermediate_and_output():
    # a language-model head (transposed weight, odd vocabulary) feeding a reduction, and returned
    h = torch.randn(2, 6, 16, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(37, 16, device=DEVICE, dtype=torch.bfloat16)

    def head(h, w):
        logits = torch.nn.functional.linear(h, w)
        return logits, logits.float().logsumexp(-1)
    logits, _ = run_case(head, [h, w], options=dict(PAD_ALWAYS, pad_mm_rows=False), check_strides=False)(h, w)
    assert logits.stride() == (6 * 40, 40, 1)   # the padded row stride, seen through the view
    # with pad_mm_rows off, the weight (read as w.t(), column-major) is padded in its own row-major
    # orientation (with it on, the default, nothing is copied: test_lm_head_rows_without_copies)
    gm = trace(head, [h, w])
    assert pad_mm.pad_matmuls(gm, 0, on_cpu=True, rows=False) == 1
    pads = [n for n in gm.graph.nodes if n.target == torch.ops.aten.constant_pad_nd.default]
    pad = next(n for n in pads if n.args[0].target == torch.ops.aten.permute.default)
    assert pad.args[1] == [0, 0, 0, 3] and pad.meta["val"].shape == (40, 16)


def test_lm_head_rows_without_copies():
    # only N (the vocabulary) misaligned, both operands aligned as they are: the product is written
    # into rows 40 apart (ember_native::mm_rows), the same strides as the padded path gives, and
    # no operand is copied
    h = torch.randn(2, 6, 16, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(37, 16, device=DEVICE, dtype=torch.bfloat16)

    def head(h, w):
        logits = torch.nn.functional.linear(h, w)
        return logits, logits.float().logsumexp(-1)
    compiled = run_case(head, [h, w], options=PAD_ALWAYS, check_strides=False)
    logits, _ = compiled(h, w)
    assert logits.stride() == (6 * 40, 40, 1)
    assert compiled.ember_native["report"]["extern_ops"] == ["ember_native.mm_rows.default"]
    count, targets = _padded_nodes(head, [h, w])
    assert count == 1 and pad_mm.MM_ROWS in targets
    assert torch.ops.aten.constant_pad_nd.default not in targets and torch.ops.aten.mm.default not in targets


@pytest.mark.parametrize("case", ["row_major_weight", "odd_activation_rows", "bias"])
def test_rows_only_where_operands_are_aligned(case):
    # a misaligned leading dimension in an operand (or a bias: addmm into a strided result copies the
    # broadcast bias first) keeps the padded path
    x = torch.randn(10, 24 if case != "odd_activation_rows" else 21, device=DEVICE, dtype=torch.bfloat16)
    if case == "row_major_weight":
        fn, inputs = (lambda x, w: x @ w), [x, torch.randn(24, 21, device=DEVICE, dtype=torch.bfloat16)]
    elif case == "odd_activation_rows":
        fn, inputs = (lambda x, w: x @ w.t()), [x, torch.randn(13, 21, device=DEVICE, dtype=torch.bfloat16)]
    else:
        fn = lambda x, w, b: torch.nn.functional.linear(x, w, b)  # noqa: E731
        inputs = [x, torch.randn(21, 24, device=DEVICE, dtype=torch.bfloat16),
                  torch.randn(21, device=DEVICE, dtype=torch.bfloat16)]
    count, targets = _padded_nodes(fn, inputs)
    assert count == 1 and torch.ops.aten.constant_pad_nd.default in targets and pad_mm.MM_ROWS not in targets
    run_case(fn, inputs, options=PAD_ALWAYS, check_strides=False)


def test_wrapper_imports_the_module_of_every_ember_native_op():
    # a wrapper loaded from the on-disk cache in a fresh process calls torch.ops.ember_native.*:
    # it imports the module that defines each (wrapper.OP_MODULES)
    import importlib
    from ember.native import wrapper
    for name, mod in wrapper.OP_MODULES.items():
        importlib.import_module(f"ember.native.{mod}")
        assert hasattr(torch.ops.ember_native, name), (name, mod)
    defined = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("ember_native::")}
    assert defined <= set(wrapper.OP_MODULES), defined - set(wrapper.OP_MODULES)


def test_addmm_bias_padded():
    x = torch.randn(10, 24, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(21, 24, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(21, device=DEVICE, dtype=torch.bfloat16)
    f = lambda x, w, b: torch.nn.functional.linear(x, w, b)  # noqa: E731
    run_case(f, [x, w, b], options=PAD_ALWAYS, check_strides=False)
    count, targets = _padded_nodes(f, [x, w, b])
    assert count == 1 and torch.ops.aten.addmm.default in targets


def test_aligned_or_small_left_alone():
    a = torch.randn(16, 32, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(32, 24, device=DEVICE, dtype=torch.bfloat16)
    assert _padded_nodes(lambda a, b: a @ b, [a, b])[0] == 0      # aligned
    gm = trace(lambda a, b: a @ b, [a[:, :31], b[:31]])
    assert pad_mm.pad_matmuls(gm, on_cpu=True) == 0                 # below the default flop bound


def test_cse_merges_repeated_pure_ops_but_not_outputs():
    from ember.native import passes
    x = torch.randn(4, 8, device=DEVICE)

    def f(x):
        m = (x > 0).float()
        a = torch.exp(m.expand(2, 4, 8)) + 1   # the same expand and exp, twice
        b = torch.exp(m.expand(2, 4, 8)) + 2
        return a, b, x.clone(), x.clone()       # two returned clones must stay two tensors
    gm = trace(f, [x])
    assert passes.cse(gm) == 2                     # expand and exp merged; the clones kept
    outs = run_case(f, [x])(x)
    assert outs[2].data_ptr() != outs[3].data_ptr()


def test_cse_keeps_random_ops_apart():
    from ember.native import passes
    x = torch.randn(64, device=DEVICE)
    gm = trace(lambda x: (torch.nn.functional.dropout(x, 0.5) + torch.nn.functional.dropout(x, 0.5)), [x])
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    passes.cse(gm)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == before


def test_backward_expects_the_padded_layout_the_forward_saves():
    # a padded matmul's result keeps its padded rows; saved for the backward, it reaches the backward
    # with those strides, which the backward must have been compiled for (else its wrapper runs the
    # ATen graph eagerly at every call: GPT-2's logits, row stride 50264 against eager's 50257)
    from ember.aot import aot_autograd
    from ember.native import DECOMPOSITIONS, backend, compile_aten_graph

    def native(gm, example_inputs):
        return compile_aten_graph(gm, example_inputs, force_triton=True, options=PAD_ALWAYS)
    bw_examples = []

    def bw_compiler(gm, example_inputs):
        bw_examples.append([tuple(e.stride()) for e in example_inputs if isinstance(e, torch.Tensor)])
        return native(gm, example_inputs)

    def f(x, w):
        y = x @ w
        return (y * y).sum()
    x = torch.randn(16, 32, device=DEVICE, requires_grad=True)
    w = torch.randn(32, 7, device=DEVICE, requires_grad=True)
    compiled = aot_autograd(fw_compiler=native, bw_compiler=bw_compiler, decompositions=DECOMPOSITIONS)(
        torch.fx.symbolic_trace(f), [x, w])
    before = backend.COUNTERS["layout_fallbacks"]
    out = compiled(x, w)
    out = out[0] if isinstance(out, (tuple, list)) else out
    gx, gw = torch.autograd.grad(out, [x, w])
    rx, rw = torch.autograd.grad(f(x, w), [x, w])
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)
    assert (8, 1) in bw_examples[0], bw_examples  # y, saved with its padded rows
    assert backend.COUNTERS["layout_fallbacks"] == before  # the backward ran its compiled kernels


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpt2_logits_on_the_gpu_run_one_gemm():
    # GPT-2 124M's logits at 8x512 (bf16, the tied embedding read transposed): cuBLAS writes the padded
    # rows itself (ember_native::mm_rows): one kernel per call, no pad or copy kernel, equal to eager
    from torch.profiler import ProfilerActivity, profile
    h = torch.randn(8, 512, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(50257, 768, device="cuda", dtype=torch.bfloat16) * 0.02
    compiled = run_case(lambda h, w: torch.nn.functional.linear(h, w), [h, w], check_strides=False)
    assert compiled.ember_native["report"]["extern_ops"] == ["ember_native.mm_rows.default"]
    assert compiled.ember_native["report"]["kernels"] == 0
    compiled(h, w)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = compiled(h, w)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert len(names) == 1, names
    assert out.stride() == (512 * 50264, 50264, 1)
