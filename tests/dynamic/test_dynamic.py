"""Dynamic shapes: automatic dynamic (dynamic=None), dynamic=True/False, mark_dynamic & co., guards on
symbolic relations with readable miss reasons, symbolic ints, and training, on every backend.
Eager PyTorch is the oracle for every output."""
import pytest
import torch
from torch import nn

import ember
from ember.testing import CompileCounter


def _compiles(fn) -> int:
    return fn._ember_cache.compile_count


def _reasons(fn) -> list:
    return fn._ember_cache.recompile_reasons


def _block():
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_transformer_20_sequence_lengths_compiles_at_most_twice(backend):
    layer = _block()
    compiled = ember.compile(layer, backend=backend)
    for s in range(2, 22):
        x = torch.randn(2, s, 32)
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)
    assert _compiles(compiled) == 2, _reasons(compiled)
    assert _reasons(compiled) == ["src.shape[1] changed: 2 -> 3"]


def test_hf_gpt2_20_sequence_lengths_compiles_twice():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)).eval()
    compiled = ember.compile(model, backend="aot_eager")
    with torch.no_grad():
        for s in range(3, 23):
            ids = torch.randint(0, 100, (2, s))
            torch.testing.assert_close(compiled(input_ids=ids, use_cache=False).logits,
                                       model(input_ids=ids, use_cache=False).logits)
    assert _compiles(compiled) == 2, _reasons(compiled)


def test_dynamic_true_starts_symbolic_and_dynamic_false_never():
    def f(x):
        return (x * 2).sum(0)

    dyn = ember.compile(f, dynamic=True, backend="eager")
    static = ember.compile(f, dynamic=False, backend="eager")
    for n in (3, 4, 5, 6):
        x = torch.randn(n, 5)
        torch.testing.assert_close(dyn(x), f(x))
        torch.testing.assert_close(static(x), f(x))
    assert _compiles(dyn) == 1
    assert _compiles(static) == 4
    assert "__sym_" in dyn._ember_cache.entries[0].source


def test_sizes_zero_and_one_stay_specialized():
    f = ember.compile(lambda x: x + x.shape[0], dynamic=True, backend="eager")
    for n in (4, 5, 1, 6, 1, 0):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x), x + n)
    assert _compiles(f) == 3  # symbolic n >= 2, n == 1, n == 0
    assert any(">= 2" in r for r in _reasons(f)), _reasons(f)


def test_relation_between_dims_is_guarded_and_named_on_a_miss():
    def f(x, y):
        if x.shape[0] == y.shape[0]:
            return x + y
        return x.sum() + y.sum()

    c = ember.compile(f, dynamic=True, backend="eager")
    for a, b in ((4, 4), (6, 6), (5, 7), (8, 9), (3, 3)):
        x, y = torch.randn(a), torch.randn(b)
        torch.testing.assert_close(c(x, y), f(x, y))
    assert _compiles(c) == 2
    assert _reasons(c)[0] == "shape relation x.size(0) == y.size(0) no longer holds (x.size(0) = 5, y.size(0) = 7)"


def test_same_size_dims_stay_tied_by_broadcasting():
    c = ember.compile(lambda x, y: x * y, dynamic=True, backend="eager")
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    torch.testing.assert_close(c(x, y), x * y)
    x, y = torch.randn(7, 3), torch.randn(7, 3)
    torch.testing.assert_close(c(x, y), x * y)
    assert _compiles(c) == 1
    # the graph assumed x.size(0) == y.size(0): a call breaking it must not reuse the entry
    x, y = torch.randn(7, 3), torch.randn(1, 3)
    torch.testing.assert_close(c(x, y), x * y)
    assert _compiles(c) == 2


def test_shape_arithmetic_stays_symbolic_and_returns_ints():
    cnt = CompileCounter()

    @ember.compile(backend=cnt)
    def f(x):
        b, s = x.shape
        flat = x.reshape(b * s)
        return flat.view(b, s) * 2, x.size(1) + 1, x.numel() // b

    for s in (4, 5, 6, 9):
        x = torch.randn(3, s)
        out, k, n = f(x)
        torch.testing.assert_close(out, x * 2)
        assert (k, n) == (s + 1, s)
    assert cnt.frame_count == 2


def test_mark_dynamic_compiles_once_and_enforces_bounds():
    def f(x):
        return x.cumsum(0) * x.shape[0]

    c = ember.compile(f, backend="eager")
    x = torch.randn(8, 3)
    ember.mark_dynamic(x, 0, min=2, max=64)
    torch.testing.assert_close(c(x), f(x))
    for n in (9, 30, 64):
        y = torch.randn(n, 3)
        torch.testing.assert_close(c(y), f(y))
    assert _compiles(c) == 1
    y = torch.randn(65, 3)  # outside [2, 64]: the entry does not claim it
    torch.testing.assert_close(c(y), f(y))
    assert _compiles(c) == 2
    assert "x.size(0) <= 64" in _reasons(c)[0]


def test_mark_dynamic_bad_bounds_and_specialization_are_clear_errors():
    x = torch.randn(8, 3)
    with pytest.raises(ValueError, match="outside the given bounds"):
        ember.mark_dynamic(x, 0, min=10)
    with pytest.raises(IndexError, match="out of range"):
        ember.mark_dynamic(x, 5)

    def specializes(x):
        return x * 2 if x.shape[0] == 8 else x

    c = ember.compile(specializes, backend="eager")
    ember.mark_dynamic(x, 0)
    with pytest.raises(ember.ConstraintViolation, match=r"x.size\(0\) was marked dynamic"):
        c(x)

    def narrows(x):
        return x * 2 if x.shape[0] > 5 else x

    c = ember.compile(narrows, backend="eager")
    x = torch.randn(8, 3)
    ember.mark_dynamic(x, 0, min=2, max=32)
    with pytest.raises(ember.ConstraintViolation, match="only works for sizes in"):
        c(x)


def test_maybe_mark_dynamic_falls_back_to_static_without_error():
    def specializes(x):
        return x * 2 if x.shape[0] == 8 else x

    c = ember.compile(specializes, backend="eager")
    x = torch.randn(8, 3)
    ember.maybe_mark_dynamic(x, 0)
    torch.testing.assert_close(c(x), x * 2)


def test_mark_static_wins_over_dynamic_true():
    c = ember.compile(lambda x: x.sum(1), dynamic=True, backend="eager")
    for n in (3, 4, 5):
        x = torch.randn(n, 4)
        ember.mark_static(x, 0)
        torch.testing.assert_close(c(x), x.sum(1))
    assert _compiles(c) == 3


def test_python_ints_become_symbolic():
    def f(x, n):
        return x.new_zeros(n, 2) + x.sum() * n

    dyn = ember.compile(f, dynamic=True, backend="aot_eager")
    auto = ember.compile(f, backend="eager")
    x = torch.randn(3)
    for n in (2, 3, 4, 5):
        torch.testing.assert_close(dyn(x, n), f(x, n))
        torch.testing.assert_close(auto(x, n), f(x, n))
    assert _compiles(dyn) == 1
    assert _compiles(auto) == 2  # static first, then n symbolic after it changed


def test_parameters_stay_static_under_dynamic_true():
    lin = nn.Linear(4, 3)
    c = ember.compile(lin, dynamic=True, backend="eager")
    for n in (2, 5, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(c(x), lin(x))
    src = c._ember_cache.entries[0].source
    assert "== (3, 4)" in src                    # the weight's shape is checked as a constant
    assert "weight.size(" not in src and "= input.size(0)" in src  # only the input's sizes are symbols


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_training_with_changing_lengths_matches_eager(backend):
    layer = _block().train()
    twin = _block().train()
    compiled = ember.compile(twin, backend=backend)
    for s in (4, 5, 9):
        x = torch.randn(2, s, 32)
        layer(x).pow(2).mean().backward()
        compiled(x).pow(2).mean().backward()
    for p, q in zip(layer.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    assert _compiles(compiled) == 2


def test_native_kernels_under_dynamic_shapes(monkeypatch):
    # the native backend (Triton in the interpreter here) compiles the symbolic graph once, into
    # kernels taking their sizes as arguments, and the frontend compiles once
    from ember.config import config
    from ember.native.backend import COUNTERS

    monkeypatch.setattr(config, "native_force_triton", True)
    f = ember.compile(lambda x: torch.softmax(x * 2, -1) + 1, dynamic=True)
    before = dict(COUNTERS)
    for n in (3, 5, 6):
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x), torch.softmax(x * 2, -1) + 1)
    assert _compiles(f) == 1
    if COUNTERS["graphs"] != before["graphs"]:  # 0 when the graph came from the on-disk cache
        assert COUNTERS["graphs"] == before["graphs"] + 1
    assert COUNTERS["per_shape"] == before["per_shape"]


def test_guards_are_readable_python():
    c = ember.compile(lambda x, y: torch.cat([x, y]).sum(), dynamic=True, backend="eager")
    c(torch.randn(4, 3), torch.randn(5, 3))
    src = c._ember_cache.entries[0].source
    assert "= x.size(0)" in src and "= y.size(0)" in src and "symbolic sizes: SHAPE" in src
