"""Exact eager semantics through the autograd layer: mutations, aliasing, views, non-tensor outputs,
requires_grad mixes, no_grad regions, random ops, autocast, the inference path, create_graph.

Every test runs a function eagerly and through ``ember.compile(..., backend=Recorder())`` (an
aot_autograd backend running ATen graphs eagerly) and compares values, gradients and side effects.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from aot_helpers import Recorder, assert_same_buffers, assert_same_grads, close, train_step_pair


def leaf(*shape, grad=True, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def twin(t):
    """An independent copy of a leaf (same value, same requires_grad)."""
    return t.detach().clone().requires_grad_(t.requires_grad)


# ------------------------------------------------------------------------------------------ mutation

def test_mutation_of_plain_input_is_written_back():
    def f(x, w):
        x.add_(1)
        return (x * w).sum()

    x, w = torch.randn(4), leaf(4)
    x2, w2 = x.clone(), twin(w)
    rec = Recorder()
    ref = f(x, w)
    out = ember.compile(f, backend=rec)(x2, w2)
    close(out, ref)
    close(x2, x)
    ref.backward()
    out.backward()
    close(w2.grad, w.grad)
    assert rec.kinds() == ["training"]


def test_mutation_of_non_leaf_input_requiring_grad():
    def f(x, w):
        x.mul_(w)          # legal in eager: x is not a leaf
        return x.sin()

    a, w = leaf(4), leaf(4)
    a2, w2 = twin(a), twin(w)
    x, x2 = a * 2, a2 * 2
    ref = f(x, w)
    out = ember.compile(f, backend=Recorder())(x2, w2)
    close(out, ref)
    close(x2, x)
    assert x2.grad_fn is not None  # the copy back is recorded by autograd, as the eager mul_ was
    (ref.sum() + x.sum()).backward()
    (out.sum() + x2.sum()).backward()
    close(a2.grad, a.grad)
    close(w2.grad, w.grad)


def test_mutation_under_no_grad_of_a_parameter():
    def f(x, w):
        with torch.no_grad():
            w.mul_(0.5)    # e.g. a weight renormalisation inside the model
        return (x * w).sum()

    x, w = torch.randn(3), leaf(3)
    w2 = twin(w)
    ref = f(x, w)
    out = ember.compile(f, backend=Recorder())(x, w2)
    close(w2, w)
    assert w2.is_leaf
    ref.backward()
    out.backward()
    close(w2.grad, w.grad)


def test_batchnorm_running_stats_are_updated():
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU()).train()
    x = torch.randn(5, 6)
    ref, test, ref_loss, loss, rec = train_step_pair(model, lambda m: m(x).pow(2).sum())
    close(loss, ref_loss)
    assert_same_grads(ref, test)
    assert_same_buffers(ref, test)
    assert int(test[1].num_batches_tracked) == 1
    # the graph mutates three buffers: they come back as traced outputs and are copied into the buffers,
    # all three by one _foreach_copy_ (mutations under no_grad)
    assert len(rec.variants[0].meta.mutated) == 3
    from ember.aot.runtime import _copy_plan
    assert [len(part) for part in _copy_plan(rec.variants[0].meta)] == [3, 0]


def test_batchnorm_buffers_updated_on_the_inference_path():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()   # train mode, but no grads
    twin_model = copy.deepcopy(model)
    rec = Recorder()
    compiled = ember.compile(twin_model, backend=rec)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        for _ in range(2):
            close(compiled(x), model(x))
    assert_same_buffers(model, twin_model)
    assert rec.kinds() == ["inference"]


def test_output_that_is_a_mutated_input_is_the_same_object():
    def f(x, w):
        x.mul_(2)
        return x, w * x

    x, w = torch.randn(3), leaf(3)
    out = ember.compile(f, backend=Recorder())(x, w)
    assert out[0] is x


def test_in_place_metadata_mutation_runs_eagerly():
    def f(x, w):
        y = x * w
        x.t_()
        return y

    x, w = torch.randn(2, 3), leaf(2, 3)
    x2 = x.clone()
    rec = Recorder()
    ref = f(x, w)
    out = ember.compile(f, backend=rec)(x2, w)
    assert x2.shape == x.shape
    close(out, ref)
    assert rec.kinds() == ["eager"] and "t_" in rec.variants[0].reason


# ------------------------------------------------------------------------------------- aliasing/views

def test_output_view_of_input_aliases_it():
    def f(x):
        return x.view(-1), x[1]

    x = leaf(3, 4)
    v, row = ember.compile(f, backend=Recorder())(x)
    assert v._base is x and row._base is x
    with torch.no_grad():
        x[1, 0] = 100.0
    assert v[4] == 100.0 and row[0] == 100.0  # still views of the input
    (v.sum() + row.sum()).backward()
    expected = torch.ones(3, 4)
    expected[1] += 1
    close(x.grad, expected)


def test_output_view_of_detached_input_does_not_require_grad():
    """A view of a detached input needs no gradient; rebuilding it on the real input must not
    attach it to the graph. (A view made under no_grad of an input that requires grad does
    require grad, in eager too.)"""
    def f(x):
        with torch.no_grad():
            row = x[1]
        return row, x.detach().view(-1), x.detach()[1:], x[0] * 2

    x = leaf(3, 4)
    expected = f(x)
    actual = ember.compile(f, backend=Recorder())(x)
    for a, e in zip(actual, expected):
        assert a.requires_grad == e.requires_grad, (a.requires_grad, e.requires_grad)
        close(a, e)
    for a in actual[:3]:  # still sharing the input's memory
        assert a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_outputs_aliasing_each_other_stay_aliased():
    def f(x):
        h = x * 2
        return h, h.view(-1), h[0]

    x = leaf(3, 4)
    h, flat, first = ember.compile(f, backend=Recorder())(x)
    assert flat._base is h and first._base is h
    flat.mul_(2)        # visible through every alias, as in eager
    close(h, x.detach() * 4)
    close(first, x.detach()[0] * 4)
    h.sum().backward()
    close(x.grad, torch.full((3, 4), 4.0))


def test_view_of_intermediate_can_be_modified_in_place():
    def f(x):
        return (x * 2).view(-1)

    x = leaf(2, 3)
    out = ember.compile(f, backend=Recorder())(x)
    out.add_(1)         # eager allows this; a view returned by a custom Function would not
    out.sum().backward()
    close(x.grad, torch.full((2, 3), 2.0))


def test_views_inside_the_graph():
    def f(x, w):
        y = x.t().contiguous().view(2, -1)
        z = y[:, 1:].unsqueeze(0).expand(3, -1, -1)
        return (z * w).sum(), y.shape

    x, w = leaf(4, 3), leaf(1, 1, 5)
    x2, w2 = twin(x), twin(w)
    ref = f(x, w)
    out = ember.compile(f, backend=Recorder())(x2, w2)
    close(out[0], ref[0])
    assert out[1] == ref[1]
    ref[0].backward()
    out[0].backward()
    close(x2.grad, x.grad)
    close(w2.grad, w.grad)


# --------------------------------------------------------------------------- outputs and requires_grad

def test_non_tensor_outputs():
    def f(x):
        return x * 2, x.shape[0], x.dim() + 0.5, x.dtype

    x = leaf(3, 2)
    out = ember.compile(f, backend=Recorder())(x)
    assert out[1:] == (3, 2.5, torch.float32)
    close(out[0], x.detach() * 2)


def test_requires_grad_mix():
    def f(a, b, w):
        return a * w, b * 3, (a * b).sum(), w.detach() * 2

    a, b, w = leaf(3), torch.randn(3), leaf(3)
    a2, w2 = twin(a), twin(w)
    ref = f(a, b, w)
    out = ember.compile(f, backend=Recorder())(a2, b, w2)
    assert [o.requires_grad for o in out] == [o.requires_grad for o in ref] == [True, False, True, False]
    for o, r in zip(out, ref):
        close(o, r)
    (ref[0].sum() + ref[2]).backward()
    (out[0].sum() + out[2]).backward()
    close(a2.grad, a.grad)
    close(w2.grad, w.grad)


def test_unused_parameter_gets_no_gradient():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)

    m = M()
    compiled = ember.compile(m, backend=Recorder())
    compiled(torch.randn(2, 3)).sum().backward()
    assert m.used.weight.grad is not None
    assert m.unused.weight.grad is None  # None, as in eager: optimizers skip it (zeros would not be skipped)


def test_output_without_a_gradient_gets_zeros_in_the_backward():
    # two differentiable outputs, the loss reads one: the backward still gets a (zero) gradient for
    # the other, made by the runtime (autograd no longer materializes them: see _make_function)
    w = torch.randn(4, 4, requires_grad=True)

    def f(x, w):
        h = x @ w
        return h.relu(), h.sigmoid(), h.detach() + 1  # (relu, sigmoid: differentiable; last: not)

    x = torch.randn(3, 4)
    rec = Recorder()
    a, b, c = ember.compile(f, backend=rec)(x, w)
    a.sum().backward()
    got = w.grad.clone()
    w.grad = None
    ea, eb, ec = f(x, w)
    ea.sum().backward()
    close(got, w.grad)
    close(c, ec)
    w.grad = None
    a, b, c = ember.compile(f, backend=rec)(x, w)
    (b * 2).sum().backward()  # now only the second one
    got = w.grad.clone()
    w.grad = None
    ea, eb, ec = f(x, w)
    (eb * 2).sum().backward()
    close(got, w.grad)
    assert rec.compiled and all(v.kind == "training" for g in rec.compiled for v in g.variants.values())


def test_no_grad_region_inside_the_graph():
    def f(y):
        with torch.no_grad():
            z = y * 2
        return z + y, z

    y = leaf(3)
    y2 = twin(y)
    ref = f(y)
    out = ember.compile(f, backend=Recorder())(y2)
    assert not out[1].requires_grad
    ref[0].sum().backward()
    out[0].sum().backward()
    close(y2.grad, y.grad)   # ones: nothing flows through the no_grad product


def test_enable_grad_inside_no_grad_call_runs_eagerly():
    def f(x, w):
        with torch.enable_grad():
            return x * w

    w = leaf(3)
    rec = Recorder()
    with torch.no_grad():
        out = ember.compile(f, backend=rec)(torch.randn(3), w)
    assert out.requires_grad
    assert rec.kinds() == ["eager"]


def test_variant_per_requires_grad_pattern():
    m = nn.Linear(3, 3)
    rec = Recorder()
    compiled = ember.compile(m, backend=rec)
    x = torch.randn(2, 3)
    compiled(x).sum().backward()
    m.zero_grad(set_to_none=True)
    m.bias.requires_grad_(False)
    compiled(x).sum().backward()
    assert m.bias.grad is None and m.weight.grad is not None
    m.weight.grad = None
    x3 = x.clone().requires_grad_(True)
    compiled(x3).sum().backward()
    close(x3.grad, m.weight.detach().sum(0).expand(2, 3))
    assert len(rec.kinds()) >= 2 and set(rec.kinds()) == {"training"}


# ------------------------------------------------------------------------------------------ random ops

@pytest.mark.parametrize("transposed", [False, True])
def test_dropout_draws_the_eager_random_stream(transposed):
    def f(x, w):
        h = x @ w
        if transposed:
            h = h.t()       # dropout of a non-contiguous tensor fills its mask in memory order
        return F.dropout(h, 0.4, training=True) * 3, F.dropout(h.relu(), 0.2, training=True)

    x, w = torch.randn(6, 5), leaf(5, 7)
    w2 = twin(w)
    torch.manual_seed(7)
    ref = f(x, w)
    after_ref = torch.rand(3)
    compiled = ember.compile(f, backend=Recorder())
    torch.manual_seed(7)
    out = compiled(x, w2)
    after = torch.rand(3)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    torch.testing.assert_close(after, after_ref, rtol=0, atol=0)  # same amount of RNG consumed
    (ref[0].sum() + ref[1].sum()).backward()
    (out[0].sum() + out[1].sum()).backward()
    close(w2.grad, w.grad)


@pytest.mark.parametrize("grad", [True, False])
def test_unused_random_op_still_advances_the_generator(grad):
    # (built with symbolic_trace: ember's frontend currently drops the unused dropout itself)
    def f(x, w):
        F.dropout(x, 0.5, training=True)
        return (F.dropout(x @ w, 0.5, training=True),)

    gm = torch.fx.symbolic_trace(f)
    x, w = torch.randn(4, 4), leaf(4, 4, grad=grad)
    torch.manual_seed(0)
    ref, after_ref = f(x, w)[0], torch.rand(2)
    compiled = Recorder()(gm, [x, w])
    torch.manual_seed(0)
    out, after = compiled(x, w)[0], torch.rand(2)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(after, after_ref, rtol=0, atol=0)


def test_random_ops_are_only_in_the_forward_graph():
    rec = Recorder()
    f = ember.compile(lambda x, w: F.dropout(x @ w, 0.5, training=True).sum(), backend=rec)
    f(torch.randn(4, 4), leaf(4, 4)).backward()
    from ember.aot.ops import is_random_op
    fw, bw = rec.fw_graphs[0], rec.bw_graphs[0]
    assert any(is_random_op(n.target) for n in fw.graph.nodes if n.op == "call_function")
    assert not any(is_random_op(n.target) for n in bw.graph.nodes if n.op == "call_function")


# ---------------------------------------------------------------------------------------- autocast

def test_autocast_region_inside_the_graph():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        return y.float().relu().sum(), y.dtype

    x, w = torch.randn(8, 8), leaf(8, 8)
    w2 = twin(w)
    ref = f(x, w)
    out = ember.compile(f, backend=Recorder())(x, w2)
    assert out[1] == torch.bfloat16
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=0)  # same casts, same kernels
    ref[0].backward()
    out[0].backward()
    close(w2.grad, w.grad)


def test_autocast_around_the_compiled_call():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    twin_model = copy.deepcopy(model)
    compiled = ember.compile(twin_model, backend=Recorder())
    x = torch.randn(5, 8)
    for m in (model, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
        out.float().pow(2).sum().backward()   # the backward runs outside the autocast region
    assert out.dtype == torch.bfloat16
    assert_same_grads(model, twin_model)


# -------------------------------------------------------------------------- inference and create_graph

def test_inference_path_uses_no_autograd_function():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    rec = Recorder()
    compiled = ember.compile(m, backend=rec)
    x = torch.randn(2, 4)
    with torch.no_grad():
        out = compiled(x)
    assert out.grad_fn is None and not out.requires_grad
    assert rec.kinds() == ["inference"]
    assert rec.bw_graphs == []
    close(out, m(x).detach())


def test_inference_path_when_no_input_requires_grad():
    rec = Recorder()
    out = ember.compile(lambda a, b: (a @ b).relu(), backend=rec)(torch.randn(3, 3), torch.randn(3, 3))
    assert out.grad_fn is None and rec.kinds() == ["inference"]


def test_training_path_uses_one_autograd_function():
    rec = Recorder()
    out = ember.compile(lambda a, b: (a @ b).relu(), backend=rec)(leaf(3, 3), torch.randn(3, 3))
    assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"
    assert rec.kinds() == ["training"]


def test_create_graph_first_order_is_right_second_order_raises():
    def f(x):
        return (x.sin() * x).sum()

    x = leaf(4)
    x_ref = twin(x)
    (g_ref,) = torch.autograd.grad(f(x_ref), x_ref, create_graph=True)
    (g,) = torch.autograd.grad(ember.compile(f, backend=Recorder())(x), x, create_graph=True)
    close(g, g_ref)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


# ------------------------------------------------------------------------------------------ fallbacks

def _nonzero_graph():
    def f(x):
        return (torch.nonzero(x > 0).float().sum() * x,)   # data-dependent shape: not traceable
    return torch.fx.symbolic_trace(f)


def test_untraceable_graph_runs_eagerly_with_a_warning():
    from ember.backends.registry import lookup_backend
    gm = _nonzero_graph()
    x = leaf(5)
    with pytest.warns(UserWarning, match="running .* eagerly"):
        compiled = lookup_backend("aot_eager")(gm, [x])
    (out,) = compiled(x)
    close(out, gm(x)[0])
    assert [v.kind for v in compiled.variants.values()] == ["eager"]


def test_strict_mode_raises_instead():
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    from ember.aot import aot_autograd
    # strict re-raises the tracing failure itself (non-strict warns and runs the graph eagerly)
    with pytest.raises(DynamicOutputShapeException, match=r"aten\.nonzero\.default"):
        aot_autograd(strict=True)(_nonzero_graph(), [leaf(5)])


def test_sdpa_broadcast_mask_is_materialized_on_gpus(monkeypatch):
    """A mask broadcast along its last dim (HF's all-true padding mask under a compiler) would send
    GPU SDPA to its math path; the trace rewrite gives it a contiguous copy (CPU kernels take it as
    it is). Meta tensors stand in for a GPU."""
    from ember.aot import ops
    seen = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, *a, **kw: seen.append(attn_mask.stride()))
    for device in ("meta", "cpu"):
        q = torch.empty(2, 3, 8, 4, device=device)
        mask = torch.ones(2, 1, 8, 1, dtype=torch.bool, device=device).expand(2, 1, 8, 8)
        ops._sdpa_with_unit_stride_mask(q, q, q, mask, 0.0, False)
    assert seen == [(64, 64, 8, 1), (8, 8, 1, 0)]


def test_sdpa_with_broadcast_mask_matches_eager():
    q = torch.randn(2, 3, 8, 4, requires_grad=True)
    keep = torch.rand(2, 1, 8, 1) > 0.2

    def f(q, keep):
        return torch.nn.functional.scaled_dot_product_attention(q, q * 2, q, attn_mask=keep.expand(2, 1, 8, 8)).sum()
    compiled = ember.compile(f, backend="aot_eager")
    out = compiled(q, keep)
    assert torch.allclose(out, f(q, keep))
    g, = torch.autograd.grad(out, q)
    ref, = torch.autograd.grad(f(q, keep), q)
    assert torch.allclose(g, ref, atol=1e-6)
