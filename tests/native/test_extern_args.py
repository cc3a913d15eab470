"""Arguments of extern (ATen) calls. Values computed on another device than the graph's stay ATen
calls (Triton kernels cannot touch them: MPNet's CPU relative-position buckets), CPU scalars read
by kernels are copied to the device once, and arguments with alignment needs (memory-efficient
attention's bias, wav2vec2/hubert) get padded rows. No GPU needed: the "meta" device stands in for
CUDA where only the lowered IR is checked; padded buffers also run in the Triton interpreter."""
import pytest
import torch

pytest.importorskip("triton")

from ember.native import backend, ir, lowering  # noqa: E402
from tests.native.harness import DEVICE, run_case, trace  # noqa: E402

aten = torch.ops.aten


def _lower(fn, inputs):
    g, L, _, _ = backend.plan(trace(fn, inputs), inputs, dict(backend.DEFAULT_OPTIONS))
    return g, L


def _externs(g):
    return [n for n in g.nodes if isinstance(n, ir.ExternNode)]


def test_cpu_index_math_in_a_device_graph_stays_aten():
    """MPNet's compute_position_bias: arange and bucket math on the CPU, then .to(x.device)."""
    x, w = torch.empty(2, 4, 8, 8, device="meta"), torch.empty(32, 4, device="meta")

    def fn(x, w):
        rel = torch.arange(8)[None, :] - torch.arange(8)[:, None]
        n = rel.abs()
        big = 4 + (torch.log(n.float().clamp(min=1) / 4) / 2.0 * 4).long()
        bucket = (torch.where(n < 4, n, big.clamp(max=15)) + (rel > 0).long() * 16).to(x.device)
        return x + torch.nn.functional.embedding(bucket, w).permute(2, 0, 1)
    g, L = _lower(fn, [x, w])
    computed = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    assert computed and all(n.layout.device == L.device for n in computed)
    cpu_ops = [e for e in _externs(g) if "computes off" in e.reason]
    assert any(e.target is aten.log.default for e in cpu_ops) and any(e.target is aten.arange.start_step for e in cpu_ops)


def test_cpu_scalar_read_by_a_kernel_is_copied_to_the_device_once():
    x = torch.empty(5, 3, device="meta")

    def fn(x):
        s = torch.full((), 8.0)  # a CPU 0-d tensor, which eager lets CUDA ops read
        return x / s + s
    g, L = _lower(fn, [x])
    copies = [e for e in _externs(g) if e.target is aten._to_copy.default]
    assert len(copies) == 1 and copies[0].kwargs["device"] == L.device
    (k,) = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    assert {ld.attr[0] for ld in ir.loads_of(k.body)} == {"arg0", copies[0].name}


def _efficient_attention(q, bias):
    return aten._scaled_dot_product_efficient_attention(q, q, q, bias, False)[0]


def test_attention_bias_gets_padded_rows_and_keeps_broadcast_heads():
    """A computed [2, 1, 79, 79] mask expanded over 2 heads: rows of 79 are padded to 80 (the kernel
    checks strides against 8-element alignment) and the head dim stays a stride-0 broadcast."""
    q, m = torch.empty(2, 2, 79, 16, device="meta"), torch.empty(2, 1, 79, 79, device="meta")
    g, _ = _lower(lambda q, m: _efficient_attention(q, (m * 2).expand(2, 2, 79, 79)), [q, m])
    (k,) = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    bias = _externs(g)[0].args[3]
    assert bias.name == k.name and bias.sizes == (2, 2, 79, 79) and bias.strides == (79 * 80, 0, 80, 1)
    assert k.layout.storage_numel <= 2 * 79 * 80  # one copy per batch, not per head


def test_attention_bias_with_a_symbolic_batch_is_padded_symbolically():
    """GPT-2 exported with a dynamic batch for a CUDA AOT package: its [B, 1, L, L] mask expanded over
    the heads is padded with the batch left symbolic (this raised ``TypeError: cannot determine truth
    value`` and sent the whole graph to the per-size fallback, so the package held no kernels)."""
    q, m = torch.empty(2, 2, 79, 16, device="meta"), torch.empty(2, 1, 79, 79, device="meta")
    gm = trace(lambda q, m: _efficient_attention(q, (m * 2).expand(q.shape[0], 2, 79, 79)), [q, m],
               tracing_mode="symbolic")
    g, _, _, _ = backend.plan(gm, [q, m], dict(backend.DEFAULT_OPTIONS))
    assert g.sizevars.symbolic
    (k,) = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    bias = _externs(g)[0].args[3]
    assert bias.name == k.name and bias.strides[1:] == (0, 80, 1)  # heads broadcast, rows padded to 80
    batch = bias.sizes[0]
    assert not isinstance(batch, int) and bias.strides[0] == 79 * 80
    # the row padding of a symbolic row length rounds up at run time
    assert lowering._padded_strides((batch, 7), [0, 1], 8) == (8, 1)
    assert str(lowering._padded_strides((3, batch), [0, 1], 8)[0]) == f"8*FloorDiv({batch} + 7, 8)"


def test_aligned_bias_is_passed_as_it_is():
    q, m = torch.empty(2, 2, 80, 16, device="meta"), torch.empty(2, 2, 80, 80, device="meta")
    g, _ = _lower(lambda q, m: _efficient_attention(q, m), [q, m])
    assert not [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    assert _externs(g)[0].args[3] == ir.BufferArg("arg1", (2, 2, 80, 80), (12800, 6400, 80, 1), 0)


def test_padded_buffers_run(monkeypatch, native_cache):
    """The padded layout end to end in the interpreter: mm's first argument is asked to be aligned,
    so (a * 2) is written with rows of 8 for 7 columns, and mm reads it through those strides."""
    monkeypatch.setitem(lowering.EXTERN_ALIGN, aten.mm.default, {"self": 8})
    a, b = torch.randn(5, 7, device=DEVICE), torch.randn(7, 3, device=DEVICE)
    compiled = run_case(lambda a, b: (a * 2) @ b, [a, b], cache_dir=native_cache, atol=1e-5, rtol=1e-5)
    g, _ = _lower(lambda a, b: (a * 2) @ b, [a, b])
    assert _externs(g)[0].args[0].strides == (8, 1)
    assert compiled.ember_native["report"]["kernels"] == 1
