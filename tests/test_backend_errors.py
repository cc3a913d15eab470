"""A backend that raises while compiling a graph: one clear error naming the backend and the graph,
chained to the backend's exception, remembered for the guard set (the backend is not retried per
call), or, under ``ember.config.suppress_errors``, one warning and eager results."""
import re
import warnings

import pytest
import torch

import ember
from ember.backends import registry
from ember.diagnostics.counters import COUNTERS
from ember.testing import cache_of


class Failing:
    """A backend that raises ``error`` for graphs ``when(gm, inputs)`` picks, else runs them as they are."""

    def __init__(self, error=None, when=None):
        self.error = error if error is not None else ValueError("lowering exploded")
        self.when = when or (lambda gm, inputs: True)
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.calls += 1
        if self.when(gm, example_inputs):
            raise self.error
        return gm.forward


def f(x):
    return torch.sin(x) * 2 + 1


F_LINE = f.__code__.co_firstlineno


def test_the_error_names_backend_graph_and_remedies_and_chains_the_cause():
    backend = Failing()
    c = ember.compile(f, backend=backend)
    with pytest.raises(ember.BackendCompilerFailed) as info:
        c(torch.randn(3))
    err = info.value
    text = str(err)
    assert re.match(rf"ember: backend 'Failing' failed to compile graph \d+ of f \(.*test_backend_errors\.py:{F_LINE}; "
                    r"3 graph ops, 1 input\): ValueError: lowering exploded\n", text), text
    assert 'backend="eager" or backend="aot_eager"' in text
    assert "ember.config.suppress_errors = True (EMBER_SUPPRESS_ERRORS=1)" in text
    assert err.__cause__ is backend.error and err.inner_exception is backend.error
    assert err.__suppress_context__ and err.backend_name == "Failing"
    assert isinstance(err, ember.CompileError) and isinstance(err, RuntimeError)  # as torch's, a RuntimeError


def test_a_failing_backend_is_compiled_once_and_every_call_gets_the_same_error():
    backend = Failing()
    c = ember.compile(f, backend=backend)
    messages = []
    for _ in range(3):
        with pytest.raises(ember.BackendCompilerFailed) as info:
            c(torch.randn(3))
        messages.append(str(info.value))
        assert info.value.__cause__ is backend.error
    assert backend.calls == 1
    assert len(set(messages)) == 1
    assert cache_of(c).entries == []  # nothing runnable was cached


def test_the_failure_is_remembered_per_guard_set_only():
    # fails for float64 graphs only: float32 calls compile and run, float64 calls fail once
    backend = Failing(when=lambda gm, inputs: inputs[0].dtype == torch.float64)
    c = ember.compile(f, backend=backend, dynamic=False)
    x32, x64 = torch.randn(3), torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(c(x32), f(x32))
    for _ in range(2):
        with pytest.raises(ember.BackendCompilerFailed, match="failed to compile graph"):
            c(x64)
    torch.testing.assert_close(c(x32), f(x32))
    assert backend.calls == 2
    with pytest.raises(ember.BackendCompilerFailed):  # another guard set: compiled (and failing) on its own
        c(torch.randn(5, dtype=torch.float64))
    assert backend.calls == 3


def test_a_registered_backend_is_named_by_its_name(monkeypatch):
    backend = Failing(RuntimeError("no kernel for this"))
    monkeypatch.setitem(registry._BACKENDS, "errcfg_test_backend",
                        registry.BackendSpec("errcfg_test_backend", backend))
    c = ember.compile(f, backend="errcfg_test_backend")
    with pytest.raises(ember.BackendCompilerFailed, match=r"backend 'errcfg_test_backend' failed to compile graph "
                                                          r".*RuntimeError: no kernel for this"):
        c(torch.randn(2))


def test_the_eager_backend_failing_suggests_only_aot_eager(monkeypatch):
    backend = Failing()
    monkeypatch.setitem(registry._BACKENDS, "eager", registry.BackendSpec("eager", backend))
    with pytest.raises(ember.BackendCompilerFailed) as info:
        ember.compile(f, backend="eager")(torch.randn(2))
    assert 'compile with backend="aot_eager" (' in str(info.value)
    assert 'backend="eager"' not in str(info.value)


def test_fullgraph_raises_the_same_error():
    backend = Failing()
    with pytest.raises(ember.BackendCompilerFailed, match="backend 'Failing' failed"):
        ember.compile(f, backend=backend, fullgraph=True)(torch.randn(2))


def test_suppress_errors_runs_eagerly_with_one_warning(monkeypatch):
    monkeypatch.setattr(ember.config, "suppress_errors", True)
    before = COUNTERS["backend_failures"], COUNTERS["backend_failures_suppressed"]
    backend = Failing()
    c = ember.compile(f, backend=backend)
    xs = [torch.randn(3) for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [c(x) for x in xs]
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, f(x), rtol=0, atol=0)
    ours = [w for w in caught if "ember:" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    msg = str(ours[0].message)
    assert "backend 'Failing' failed to compile graph" in msg and "suppress_errors is on" in msg
    assert ours[0].filename == __file__  # points at the user's call
    assert backend.calls == 1
    assert (COUNTERS["backend_failures"], COUNTERS["backend_failures_suppressed"]) == (before[0] + 1, before[1] + 1)


def test_suppress_errors_keeps_gradients_side_effects_and_prints(monkeypatch, capsys):
    """The fallback is eager PyTorch for the whole callable: a module's hooks, its parameters' grads,
    a list it appends to and what it prints are eager's, once each."""
    monkeypatch.setattr(ember.config, "suppress_errors", True)
    seen = []

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            seen.append(x.shape[0])
            return self.lin(x).relu().sum()

    torch.manual_seed(0)
    m, ref = M(), M()
    ref.load_state_dict(m.state_dict())
    hooks = []
    m.register_forward_hook(lambda mod, args, out: hooks.append("hook"))
    backend = Failing()
    c = ember.compile(m, backend=backend)
    x = torch.randn(2, 4)
    with pytest.warns(UserWarning, match="backend 'Failing' failed"):
        c(x).backward()
    ref(x).backward()
    assert backend.calls == 1
    torch.testing.assert_close(m.lin.weight.grad, ref.lin.weight.grad, rtol=0, atol=0)
    assert seen == [2, 2] and hooks == ["hook"]


def test_a_failure_after_a_graph_break_falls_back_for_that_part_only(monkeypatch, capsys):
    """The resumed part after ``print`` is its own graph; its backend failure runs that part eagerly,
    the first graph stays compiled, and the print happens once per call, as in eager."""
    def g(x):
        y = torch.sin(x) + 1
        print("between")
        return torch.cos(y) * 3

    backend = Failing(when=lambda gm, inputs: any(n.target is torch.cos for n in gm.graph.nodes))
    c = ember.compile(g, backend=backend)
    x = torch.randn(3)
    resumed = (r"failed to compile graph \d+ of \S+\.g \(resumed at line \d+\) "
               r"\(.*test_backend_errors\.py:\d+; 2 graph ops")
    with pytest.raises(ember.BackendCompilerFailed, match=resumed):
        c(x)
    capsys.readouterr()
    monkeypatch.setattr(ember.config, "suppress_errors", True)
    with pytest.warns(UserWarning, match="failed to compile graph"):
        for _ in range(2):
            torch.testing.assert_close(c(x), g(x), rtol=0, atol=0)
    assert capsys.readouterr().out == "between\n" * 4  # two compiled calls, two eager ones
    assert backend.calls == 2  # the first graph once, the failing resumed graph once


def test_keyboard_interrupt_is_never_swallowed_nor_remembered(monkeypatch):
    monkeypatch.setattr(ember.config, "suppress_errors", True)
    backend = Failing(KeyboardInterrupt())
    c = ember.compile(f, backend=backend)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            c(torch.randn(2))
    assert backend.calls == 2  # not a failure of the graph: the next call compiles again


def test_reset_forgets_the_failure():
    backend = Failing()
    c = ember.compile(f, backend=backend)
    with pytest.raises(ember.BackendCompilerFailed):
        c(torch.randn(2))
    ember.reset()
    backend.error = None
    backend.when = lambda gm, inputs: False
    x = torch.randn(2)
    torch.testing.assert_close(c(x), f(x))
    assert backend.calls == 2


def test_a_forced_backend_failure_is_kept_apart_from_the_callables_own_entries():
    c = ember.compile(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(c(x), f(x))
    forced = Failing()
    with ember.set_stance("default", force_backend=forced):
        for _ in range(2):
            with pytest.raises(ember.BackendCompilerFailed, match="backend 'Failing' failed"):
                c(x)
    assert forced.calls == 1
    torch.testing.assert_close(c(x), f(x))  # the callable's own entry still serves the default stance
    assert cache_of(c).compile_count == 1
