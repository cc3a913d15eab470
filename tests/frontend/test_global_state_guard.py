"""The global-state guard, checked inline in the entry function (no call of ``global_state()``, one C
call for "autocast off everywhere"): the same answer as comparing the state tuple, in every case."""
import itertools

import torch

import ember
from ember.frontend.guards import _render_global_state, global_state

_DTYPES = (torch.float32, torch.float64)


def test_inline_check_answers_as_comparing_the_state_tuple():
    for expected in itertools.product((True, False), (True, False), (True, False), _DTYPES):
        consts = {}

        def const(value, hint):
            consts[f"__{hint}_{len(consts)}"] = value
            return f"__{hint}_{len(consts) - 1}"
        expr = " and ".join(_render_global_state(expected, const))
        # autocast may also be on for a device type the state does not record ("other")
        for grad, cpu, cuda, other, dtype in itertools.product((True, False), (True, False), (True, False),
                                                               (True, False), _DTYPES):
            ns = {"__ember_gs_grad": lambda: grad, "__ember_gs_any_autocast": lambda: cpu or cuda or other,
                  "__ember_gs_autocast": {"cpu": cpu, "cuda": cuda}.__getitem__, "__ember_gs_default_dtype": lambda: dtype,
                  **consts}
            assert eval(expr, ns) == ((grad, cpu, cuda, dtype) == expected), (expr, grad, cpu, cuda, other, dtype)


def test_entries_follow_grad_mode_autocast_and_default_dtype():
    def f(x):
        return torch.mm(x, x) + 1

    cf = ember.compile(f, backend="eager")
    x = torch.randn(4, 4)
    torch.testing.assert_close(cf(x), f(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cf(x)
        assert out.dtype == f(x).dtype == torch.bfloat16
    with torch.no_grad():
        cf(x)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        cf(x)
    finally:
        torch.set_default_dtype(old)
    cache = cf._ember_cache
    assert cache.compile_count == 4 and len(cache.recompile_reasons) == 3
    assert all("global state" not in e.source or "__global_state()" not in e.source for e in cache.entries)
    assert cf(x).dtype == torch.float32 and cache.compile_count == 4  # the first entry again
    assert global_state() == (True, False, False, torch.float32)


def test_parameters_named_like_the_state_keep_their_defaults():
    # a parameter's default is bound as __default_<name> in the entry's namespace: ``dtype``'s must
    # not be taken for the default-dtype check (Tensor.norm has one), nor the other way round
    def f(x, dtype=None, grad=2, autocast=3, any_autocast=4, default_dtype=5):
        y = x.norm() if dtype is None else x.to(dtype).norm()
        return y * grad + autocast + any_autocast + default_dtype

    cf = ember.compile(f, backend="eager")
    x = torch.randn(2, 3, requires_grad=True)
    for _ in range(2):
        torch.testing.assert_close(cf(x), f(x))
    torch.testing.assert_close(cf(x, torch.float64), f(x, torch.float64))
    assert cf._ember_cache.compile_count == 2
