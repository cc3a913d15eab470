"""ember.compile's public behaviour: call forms, bad input, the module wrapper, fallbacks, logs."""
import re
import subprocess
import sys
import warnings

import pytest
import torch

import ember
from ember.testing import CompileCounter, cache_of


def f(x):
    return torch.sin(x) * 2


def test_three_call_forms():
    x = torch.randn(4)
    assert torch.equal(ember.compile(f)(x), f(x))

    @ember.compile
    def g(x):
        return x + 1

    @ember.compile(backend="eager", fullgraph=True)
    def h(x):
        return x - 1

    assert torch.equal(g(x), x + 1) and torch.equal(h(x), x - 1)


@pytest.mark.parametrize("bad, pattern", [
    (3, r"non-callable.*pass the function itself"),
    ("not a function", r"non-callable"),
])
def test_non_callable_is_rejected(bad, pattern):
    with pytest.raises(TypeError, match=pattern):
        ember.compile(bad)


def test_generator_and_coroutine_functions_are_rejected():
    def gen(x):
        yield x

    async def coro(x):
        return x

    with pytest.raises(TypeError, match="generator function"):
        ember.compile(gen)
    with pytest.raises(TypeError, match="coroutine function"):
        ember.compile(coro)


def test_unknown_backend_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"unknown ember backend 'nope'; available: .*eager"):
        ember.compile(f, backend="nope")


def test_unknown_mode_and_mode_with_options():
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        ember.compile(f, mode="fast")
    with pytest.raises(RuntimeError, match="Either mode or options"):
        ember.compile(f, mode="default", options={})


def test_unsupported_python_version_is_a_clear_error(monkeypatch):
    import ember.frontend.bytecode as bc

    monkeypatch.setattr(bc, "PY", (3, 9))
    with pytest.raises(ember.CompileError, match=r"supports CPython 3.11 and 3.12.*Use Python 3.11 or 3.12"):
        ember.compile(f)


def test_fullgraph_error_names_construct_and_user_line():
    def uses_item(x):
        return x * x.sum().item()

    c = ember.compile(uses_item, fullgraph=True)
    with pytest.raises(ember.CompileError) as info:
        c(torch.randn(3))
    msg = str(info.value)
    assert "Tensor.item()" in msg
    line = uses_item.__code__.co_firstlineno + 1
    assert re.search(rf"test_api.py:{line}\b", msg), msg


def test_unsupported_without_fullgraph_is_a_graph_break_not_a_warning(capsys):
    def uses_print(x):
        print("hello")
        return x + 1

    c = ember.compile(uses_print)
    x = torch.randn(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph break is not worth a warning (EMBER_LOGS=graph_breaks)
        out = c(x)
        assert torch.equal(c(x), x + 1)
    assert torch.equal(out, x + 1)
    assert capsys.readouterr().out == "hello\nhello\n"
    (brk,) = cache_of(c).entries[0].breaks
    assert "print()" in brk.reason and "test_api.py" in brk.location


def test_unresumable_break_runs_the_frame_eagerly_with_one_warning():
    def uses_cell(x):
        y = x + 1
        def inner():
            return y
        y = y * 2  # y is assigned twice: the closure cannot be carried across the break by value
        print("hello")
        return inner() + 1

    c = ember.compile(uses_cell)
    x = torch.randn(2)
    with pytest.warns(UserWarning, match=r"running \S*uses_cell eagerly: print\(\)"):
        out = c(x)
    assert torch.equal(out, (x + 1) * 2 + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(c(x), (x + 1) * 2 + 1)  # no second warning


def test_recompile_limit_falls_back_to_eager_with_one_warning(monkeypatch):
    monkeypatch.setattr(ember.config, "recompile_limit", 2)
    cnt = CompileCounter()
    c = ember.compile(lambda x, n: x * n, backend=cnt, dynamic=False)  # ints would turn symbolic
    x = torch.randn(2)
    c(x, 1)
    c(x, 2)
    with pytest.warns(UserWarning, match="hit the recompile limit"):
        assert torch.equal(c(x, 3), x * 3)
    assert torch.equal(c(x, 4), x * 4)
    assert cache_of(c).compile_count == 2 and cnt.frame_count == 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.scale = 3.0

    def forward(self, x):
        return self.drop(self.lin(x)) * self.scale


def test_module_wrapper_behaves_like_the_module():
    torch.manual_seed(0)
    net = Net()
    opt = ember.compile(net)
    assert isinstance(opt, ember.OptimizedModule) and opt._orig_mod is net
    assert opt.scale == 3.0 and opt.lin is net.lin
    assert list(opt.parameters()) == list(net.parameters())  # shared, not copied
    assert opt.state_dict().keys() == net.state_dict().keys()
    fresh = Net()
    fresh.load_state_dict(opt.state_dict())  # a saved state_dict loads into the plain model
    opt.eval()
    assert not net.training and not opt.training
    x = torch.randn(2, 4)
    torch.testing.assert_close(opt(x), net(x))
    opt.scale = 5.0  # attribute writes reach the original, and the guard notices
    assert net.scale == 5.0
    torch.testing.assert_close(opt(x), net(x))
    assert any("scale" in r for r in cache_of(opt).recompile_reasons)
    opt.train()
    assert net.training
    torch.manual_seed(1)
    a = opt(x)
    torch.manual_seed(1)
    torch.testing.assert_close(a, net(x))  # dropout active, same random stream as eager
    assert "training" in cache_of(opt).recompile_reasons[-1]


def test_forward_hooks_are_honoured():
    lin = torch.nn.Linear(3, 3)
    lin.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    lin.register_forward_hook(lambda m, args, out: out + 100)
    cnt = CompileCounter()
    c = ember.compile(lin, backend=cnt, fullgraph=True)
    x = torch.randn(2, 3)
    torch.testing.assert_close(c(x), lin(x))
    assert cnt.frame_count == 1
    h = lin.register_forward_hook(lambda m, args, out: out * 0)
    torch.testing.assert_close(c(x), lin(x))  # a new hook is a guard miss, then traced
    h.remove()
    torch.testing.assert_close(c(x), lin(x))


def test_output_code_log_is_readable_python():
    code = (
        "import torch, ember\n"
        "def f(x, n):\n    return torch.relu(x) * n\n"
        "ember.compile(f)(torch.randn(3), 2)\n"
    )
    env = {"EMBER_LOGS": "output_code,guards,graph_code", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "def __ember_entry_" in out.stderr
    assert "compiled from f at <string>:2" in out.stderr
    assert "x.shape == (3,)" in out.stderr  # the tensor guard, readable
    assert "torch.relu(x)" in out.stderr  # the graph code: the FX call, readable


def test_bad_env_log_name_is_a_clear_error():
    import os

    env = {**os.environ, "EMBER_LOGS": "graph_brakes"}
    out = subprocess.run([sys.executable, "-c", "import ember"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0  # at import, where the variable is read: not at the first log line
    assert "EMBER_LOGS='graph_brakes'" in out.stderr and "did you mean 'graph_breaks'?" in out.stderr


def test_inlining_depth_limit_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ember.config, "inline_depth_limit", 10)

    def down(x, n):
        return x if n == 0 else down(x + 1, n - 1)

    c = ember.compile(lambda x: down(x, 50), fullgraph=True)
    with pytest.raises(ember.CompileError, match=r"inlining depth limit \(10\) reached.*recursion"):
        c(torch.zeros(1))
    ok = ember.compile(lambda x: down(x, 5), fullgraph=True)
    assert torch.equal(ok(torch.zeros(1)), torch.full((1,), 5.0))


def test_compiling_does_not_consume_the_random_stream():
    """The first call compiles (tracing, the backend's own tracing) and must still draw exactly the
    numbers eager draws after the same seed: same dropout mask, same torch.rand values."""
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, True) + torch.rand(3)

    for backend in ("eager", "aot_eager", "ember"):
        torch.manual_seed(0)
        expected = f(torch.ones(3))
        torch.manual_seed(0)
        actual = ember.compile(f, backend=backend)(torch.ones(3))
        assert torch.equal(actual, expected), backend
