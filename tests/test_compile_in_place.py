"""``ember.compile_module_``: a module compiled in place (as ``nn.Module.compile()`` does) keeps its
class and identity, runs its calls through ember, and falls back to eager without re-entering itself."""
import copy
import io
import pickle
import warnings

import pytest
import torch

import ember
from ember.testing import CompileCounter, cache_of


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


class Printing(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        print("between graphs")
        return y * 2


class Unresumable(torch.nn.Module):
    def forward(self, x):
        y = x + 1

        def inner():
            return y
        y = y * 2  # assigned twice while a closure holds it: the break cannot resume, the frame runs eagerly
        print("eager frame")
        return inner() + 1


def test_keeps_class_identity_and_state_and_runs_compiled():
    net = Net()
    x = torch.randn(3, 4)
    expected = net(x)
    cnt = CompileCounter()
    keys = list(net.state_dict())
    assert ember.compile_module_(net, backend=cnt) is net
    assert type(net) is Net and list(net.state_dict()) == keys
    torch.testing.assert_close(net(x), expected)
    torch.testing.assert_close(net(x + 1), Net.forward(net, x + 1))
    assert cnt.frame_count == 1 and cache_of(net).compile_count == 1


def test_training_gradients_match_eager():
    torch.manual_seed(0)
    eager, compiled = Net(), Net()
    compiled.load_state_dict(eager.state_dict())
    ember.compile_module_(compiled, backend="aot_eager")
    x = torch.randn(3, 4)
    eager(x).sum().backward()
    compiled(x).sum().backward()
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad)


def test_hooks_are_honoured_and_a_new_hook_recompiles():
    net = Net()
    cnt = CompileCounter()
    ember.compile_module_(net, backend=cnt)
    x = torch.randn(2, 4)
    plain = Net.forward(net, x)
    torch.testing.assert_close(net(x), plain)
    handle = net.register_forward_hook(lambda m, args, out: out + 100)
    torch.testing.assert_close(net(x), plain + 100)
    assert cnt.frame_count == 2
    handle.remove()
    torch.testing.assert_close(net(x), plain)


def test_graph_break_in_forward(capsys):
    m = ember.compile_module_(Printing(), backend=CompileCounter())
    x = torch.randn(3)
    torch.testing.assert_close(m(x), (x + 1) * 2)
    torch.testing.assert_close(m(x), (x + 1) * 2)
    assert capsys.readouterr().out == "between graphs\n" * 2


def test_eager_fallbacks_do_not_reenter_the_compiled_call(monkeypatch, capsys):
    """The eager path of a module compiled in place is ``_call_impl``: ``module(...)`` would come
    back to the compiled call and recurse."""
    m = ember.compile_module_(Unresumable())
    x = torch.randn(2)
    with pytest.warns(UserWarning, match="running Unresumable eagerly"):
        torch.testing.assert_close(m(x), (x + 1) * 2 + 1)
    torch.testing.assert_close(m(x), (x + 1) * 2 + 1)
    assert capsys.readouterr().out == "eager frame\n" * 2

    monkeypatch.setattr(ember.config, "recompile_limit", 1)
    net = ember.compile_module_(Net(), backend=CompileCounter(), dynamic=False)
    net(torch.randn(2, 4))
    with pytest.warns(UserWarning, match="hit the recompile limit"):
        torch.testing.assert_close(net(x4 := torch.randn(5, 4)), Net.forward(net, x4))


def test_copies_come_out_uncompiled_and_none_uncompiles():
    net = ember.compile_module_(Net(), backend=CompileCounter())
    x = torch.randn(2, 4)
    expected = net(x)
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert clone._compiled_call_impl is None  # as nn.Module.__getstate__ does for Module.compile()
        torch.testing.assert_close(clone(x), expected)
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=False)._compiled_call_impl is None
    net._compiled_call_impl = None
    torch.testing.assert_close(net(x), expected)
    with pytest.raises(TypeError, match="not an ember-compiled"):
        cache_of(net)


def test_submodule_compiled_in_place_inside_a_compiled_parent_is_one_graph():
    inner = ember.compile_module_(Net(), backend=CompileCounter())
    outer = torch.nn.Sequential(inner, torch.nn.Tanh())
    cnt = CompileCounter()
    c = ember.compile(outer, backend=cnt, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(c(x), torch.tanh(Net.forward(inner, x)))
    assert cnt.frame_count == 1


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="compiles an nn.Module in place"):
        ember.compile_module_(lambda x: x)
    with pytest.raises(Exception, match="no_such_backend"):
        ember.compile_module_(Net(), backend="no_such_backend")
    with pytest.raises(TypeError, match="fullgraph must be True or False"):
        ember.compile_module_(Net(), fullgraph="yes")
    net = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ember.compile_module_(net, disable=True) is net and net._compiled_call_impl is None
