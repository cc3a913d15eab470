"""The runner must notice every kind of difference: a fake ``ember.compile`` that runs the
function wrongly (drops a print, reorders prints, changes the output, loses a side effect, raises a
different message, forgets a grad) must make the compiled phase report a problem."""
import contextlib
import io
import sys

import pytest
import torch

from . import harness as H

LOG = []


def _f_print(x):
    print("a")
    y = x * 2
    print("b")
    return y


def _f_effect(x):
    LOG.append(x.shape[0])
    return x + 1


def _f_raise(x):
    raise ValueError(f"bad {x.shape[0]}")


def _f_inplace(x):
    x.add_(1)
    return x.sum()


def _f_grad(x):
    return x * 3


def _mk(fn, inputs=lambda n: (torch.randn(n, 3),), setup=None):
    return H.Case(name=f"selftest.{fn.__name__}", fn=fn, module=__name__, inputs=inputs,
                  setup=setup, min_graphs=0, breaks=False)


def _records(c):
    w = H.World(c)
    recs = [w.call(w.target(), n, i) for i, n in H.CALLS]
    for r in recs:
        if r["exception"] is None:
            r.pop("_traceback")
    return recs


def _fake_compile(transform):
    def compile(fn, **kw):  # noqa: A001 - stands in for ember.compile
        return transform(fn)
    return compile


def _drop_prints(fn):
    def run(*a, **k):
        with contextlib.redirect_stdout(io.StringIO()):
            return fn(*a, **k)
    return run


def _reorder_prints(fn):
    def run(*a, **k):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            out = fn(*a, **k)
        sys.stdout.write("".join(reversed(buf.getvalue().splitlines(True))))
        return out
    return run


def _perturb_output(fn):
    return lambda *a, **k: fn(*a, **k) + 1e-3


def _lose_effects(fn):
    def run(*a, **k):
        saved = list(LOG)
        out = fn(*a, **k)
        LOG[:] = saved
        return out
    return run


def _other_message(fn):
    def run(*a, **k):
        try:
            return fn(*a, **k)
        except ValueError as e:
            raise ValueError(str(e) + "!") from None
    return run


def _copy_inputs(fn):
    return lambda *a, **k: fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in a], **k)


def _detach_output(fn):
    return lambda *a, **k: fn(*a, **k).detach()


def _wrong_after_recompile(fn):
    def run(x):
        out = fn(x)
        return out * 2 if x.shape[0] == H.N_RECOMPILE else out
    return run


@pytest.mark.parametrize("fn,transform,inputs,setup", [
    (_f_print, _drop_prints, None, None),
    (_f_print, _reorder_prints, None, None),
    (_f_print, _perturb_output, None, None),
    (_f_effect, _lose_effects, None, lambda: {"LOG": []}),
    (_f_raise, _other_message, None, None),
    (_f_inplace, _copy_inputs, None, None),
    (_f_grad, _detach_output, lambda n: (torch.randn(n, 3, requires_grad=True),), None),
    (_f_grad, _wrong_after_recompile, None, None),
], ids=["drop_prints", "reorder_prints", "perturb_output", "lose_effects", "other_message",
        "copy_inputs", "detach_output", "wrong_after_recompile"])
def test_runner_detects(monkeypatch, fn, transform, inputs, setup):
    import ember

    c = _mk(fn, inputs or (lambda n: (torch.randn(n, 3),)), setup)
    recs = _records(c)
    monkeypatch.setattr(ember, "compile", _fake_compile(transform))
    problems = H._compiled_phase(c, recs)
    assert problems, f"the runner did not notice {transform.__name__}"


def test_runner_accepts_eager_as_compiled(monkeypatch):
    import ember

    c = _mk(_f_effect, setup=lambda: {"LOG": []})
    recs = _records(c)
    monkeypatch.setattr(ember, "compile", _fake_compile(lambda fn: fn))
    assert H._compiled_phase(c, recs) == []


@pytest.mark.parametrize("name", ["loops.for_range_print_each", "exceptions.nested_try_blocks",
                                  "modules.sequential_with_printing_layer"])
def test_runner_rejects_a_compile_that_compiles_nothing(monkeypatch, name):
    """A break case whose compiled world runs every call eagerly (no graph) must fail: the
    cases that used to declare min_graphs=0 passed exactly then."""
    import ember

    c = next(k for k in H.load_all_cases() if k.name == name)
    recs = _records(c)
    monkeypatch.setattr(ember, "compile", _fake_compile(lambda fn: fn))
    problems = H._compiled_phase(c, recs)
    assert any("received 0 graph(s)" in p for p in problems), problems


def test_fp32_calls_of_an_autocast_case_get_fp32_tolerance(monkeypatch):
    """guards.caller_autocast_alternates runs under autocast on odd calls only: a 1e-3 error on an
    fp32 call is a wrong result (fp32 keeps ~7 digits), on a bfloat16 call it is rounding."""
    import ember

    c = next(k for k in H.load_all_cases() if k.name == "guards.caller_autocast_alternates")
    recs = _records(c)

    def off_by(eps_of_autocast):
        def transform(fn):
            def run(x, w):
                return fn(x, w) + eps_of_autocast[torch.is_autocast_enabled("cpu")]
            return run
        return transform
    monkeypatch.setattr(ember, "compile", _fake_compile(off_by({False: 1e-3, True: 0.0})))
    problems = H._compiled_phase(c, recs)
    assert any("call 0" in p and "values differ" in p for p in problems), problems
    monkeypatch.setattr(ember, "compile", _fake_compile(off_by({False: 0.0, True: 1e-3})))
    problems = H._compiled_phase(c, recs)
    assert not any("values differ" in p for p in problems), problems


def test_register_refuses_zero_graphs():
    with pytest.raises(ValueError, match="min_graphs=0 would pass when nothing compiles"):
        H._register(H.Case(name="selftest.zero", fn=_f_print, module=__name__,
                           inputs=lambda n: (torch.randn(n, 3),), min_graphs=0))
    assert all(k.min_graphs >= 1 for k in H.load_all_cases())


def _f_segfault(x):
    import os
    import signal
    os.kill(os.getpid(), signal.SIGSEGV)


def _f_hang(x):
    import time
    time.sleep(30)
    return x


@pytest.mark.parametrize("fn,expect", [(_f_segfault, "SIGSEGV"), (_f_hang, "hung")],
                         ids=["segfault", "hang"])
def test_worker_survives_crash_and_hang(monkeypatch, fn, expect):
    if not H.forks():
        pytest.skip("cases run in-process (BREAKS_NO_FORK, or a CUDA build of torch)")
    c = _mk(fn)
    monkeypatch.setattr(H, "CHILD_TIMEOUT_S", 3)
    H._close_worker()
    H.CASES.append(c)
    try:
        with pytest.raises(AssertionError, match=expect):
            H.run_case(c)
        # the next case runs in a fresh worker
        ok = _mk(_f_effect, setup=lambda: {"LOG": []})
        ok.name = "selftest.after_crash"
        H.CASES.append(ok)
        H._close_worker()
        H.run_case(ok)
    finally:
        H.CASES[:] = [k for k in H.CASES if not k.name.startswith("selftest.")]
        H._close_worker()
