"""``len(tensor)``, a list indexed with a 0-d integer tensor, ``max()``/``min()`` over tensors."""
import pytest
import torch

from .harness import Cases, run, t

cases = Cases("tensor_builtins")


@cases.case(lambda: (t(5, 3, grad=True),))
def len_of_tensor(x):
    n = len(x)
    return x * n, [x[i].sum() for i in range(len(x))], len(x[0])


@cases.case(lambda: (t(4), torch.tensor(2)))
def list_index_0d(x, i):
    items = [x + 1, x * 2, x - 3]
    return items[i] * 2, (10, 20, 30)[i], items[i] + 1


@cases.case(lambda: (t(4),))
def list_index_constant_tensor(x):
    items = [x + 1, x * 2, x - 3]
    return items[torch.tensor(1)] * 2, ("a", "b")[torch.tensor(-1)]


@cases.case(lambda: (t(4), torch.tensor(1, dtype=torch.int32)))
def list_setitem_0d(x, i):
    items = [x, x + 1, x + 2]
    items[i] = x * 10
    return items


@cases.case(lambda: ([t(3), t(3), t(3)], torch.tensor(0)))
def list_input_indexed(xs, i):
    xs[i] = xs[i] * 2  # mutates the input list
    return xs[i] + 1


# The choice is a torch.where in the graph: gradients reach the chosen tensor only, as in eager,
# but an unchosen leaf gets a zero gradient where eager leaves None; the cases derive every
# compared tensor from one leaf so both sides have a gradient.
@cases.case(lambda: (t(2, grad=True),))
def max_min_two_scalars(x):
    a2, b2 = x[0] * 2, x[1] * 3
    return max(a2, b2), min(a2, b2)


@cases.case(lambda: (t(6, grad=True),))
def max_min_over_list(x):
    parts = [x[:2].sum(), x[2:4].mean(), x[4:].max(), x[0] * 0.5]
    return max(parts) * 2, min(parts) + 1, max(p * 1 for p in parts)


@cases.case(lambda: (torch.tensor([1.0, float("nan"), 3.0]),))
def max_min_nan(x):
    a, b, c = x[0] * 1, x[1] * 1, x[2] * 1
    # (eager returns one of the items itself: outputs are copies so identity is not compared)
    return max(a, b) * 1, max(b, a) * 1, min(b, c) * 1, max(a, b, c) * 1, min(c, b, a) * 1


@cases.case(lambda: (torch.tensor([3, 1, 3, 7]),))
def max_min_ties_int(x):
    a, b, c, d = (x[i] + 0 for i in range(4))
    return max(a, b, c, d) * 1, min(a, b, c) * 1, max((a, c)) * 1, max([a]) * 1


@cases.case(lambda: (t(2, grad=True),))
def max_one_element_vectors(x):
    return max(x[:1] * 1, x[1:] * 2) * 3


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)


def test_index_value_change_recompiles_and_matches():
    import ember
    from ember.testing import CompileCounter

    def f(x, i):
        return [x + 1, x * 2, x - 3][i]

    cnt = CompileCounter()
    cf = ember.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    for i in (0, 2, 2, 1):
        torch.testing.assert_close(cf(x, torch.tensor(i)), f(x, torch.tensor(i)))
    assert cnt.frame_count == 3  # one graph per index value (the value guard), reused for the repeat


def test_max_of_multi_element_tensors_still_breaks():
    # eager raises (the truth value of a multi-element comparison is ambiguous): never a silent graph
    import ember

    def f(a, b):
        return max(a, b)

    with pytest.raises(ember.CompileError, match="max"):
        ember.compile(f, fullgraph=True)(torch.randn(3), torch.randn(3))


def test_max_of_a_tensor_and_a_number_still_breaks():
    # eager returns whichever wins: the Python number itself or the tensor (a type decided by the
    # data); torch.compile returns a tensor either way (torch.clamp), ember breaks the graph
    import ember

    def f(a):
        return max(0.5, a), min(a, 0.5)

    for v in (0.1, 0.9):
        a = torch.tensor([v])
        with pytest.raises(ember.CompileError, match="max"):
            ember.compile(f, fullgraph=True)(a)
        expected, actual = f(a), ember.compile(f, backend="eager")(a)
        assert [type(e) for e in expected] == [type(c) for c in actual] and expected == actual
