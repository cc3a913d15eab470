"""Breaks inside loops: the loop runs as Python, the straight-line code of its body is compiled and
runs as graphs in every iteration (ember/frontend/loops.py). Each test compares with eager (result,
printed text, side effects, grads) and counts graph *calls*, so a loop that silently ran as plain
Python fails."""
import contextlib
import io

import pytest
import torch

import ember


class CallCounter:
    """A backend that counts compiled graphs and how often they run."""

    def __init__(self):
        self.compiled = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.compiled += 1

        def run(*args):
            self.calls += 1
            return gm.forward(*args)
        return run


def _same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b, (a, b)


def check(fn, *make_args, min_calls: int, calls: int = 2):
    """Run ``fn`` eagerly and compiled ``calls`` times on fresh arguments; returns the counter."""
    cnt = CallCounter()
    compiled = ember.compile(fn, backend=cnt)
    for i in range(calls):
        args_e = [m() if callable(m) else m for m in make_args]
        args_c = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                  for a in args_e]
        out_e, out_c = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out_e):
            want = fn(*args_e)
        before = cnt.calls
        with contextlib.redirect_stdout(out_c):
            got = compiled(*args_c)
        assert out_c.getvalue() == out_e.getvalue()
        _same(got, want)
        assert cnt.calls - before >= min_calls, f"call {i}: {cnt.calls - before} graph calls, expected >= {min_calls}"
        grads = [(a, b) for a, b in zip(args_e, args_c) if isinstance(a, torch.Tensor) and a.requires_grad]
        if grads and isinstance(want, torch.Tensor) and want.requires_grad:
            want.sum().backward()
            got.sum().backward()
            for a, b in grads:
                torch.testing.assert_close(b.grad, a.grad)
    return cnt


def t(*shape, grad=False):
    return lambda: torch.randn(*shape, requires_grad=grad)


# ---- for loops over every kind of iterable --------------------------------------------------------
def test_range_print_and_item_each_iteration():
    def f(x, n):
        y = x.sin()
        for i in range(n):
            y = y * 1.1 + 0.1
            v = y.sum().item()
            print(f"step {i}: {v:.4f}")
            y = torch.tanh(y) - 0.01 * i
        return y.cos()
    check(f, t(4), 6, min_calls=6)  # at least one graph in each of the 6 iterations


def test_grads_flow_through_the_segments():
    def f(x, w):
        h = x
        for i in range(3):
            h = torch.tanh(h @ w)
            print("norm", round(h.norm().item(), 3))
        return h.sum() * 1.0
    cnt = CallCounter()
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    out_e, out_c = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_e):
        f(x, w).backward()
    with contextlib.redirect_stdout(out_c):
        ember.compile(f, backend=cnt)(x, w2).backward()
    assert out_c.getvalue() == out_e.getvalue()
    torch.testing.assert_close(w2.grad, w.grad)
    assert cnt.calls >= 3


def test_list_enumerate_zip_dict_tensor_generator():
    def over_list(xs):
        acc = torch.zeros(3)
        for v in xs:
            acc = acc + v * 2
            print("item", round(acc.sum().item(), 4))
            acc = acc.relu()
        return acc

    def over_enumerate_zip(xs, ys):
        acc = torch.zeros(3)
        for i, (a, b) in enumerate(zip(xs, ys)):
            acc = acc + a * b
            print("pair", i)
            acc = acc * 0.5
        return acc

    def over_dict(d):
        acc = torch.ones(3)
        for key, val in d.items():
            acc = acc * val
            print(key)
            acc = acc + 1
        return acc

    def over_tensor(x):
        acc = torch.zeros(3)
        for row in x:
            acc = acc + row.exp()
            print("row", row.shape)
            acc = acc / 2
        return acc

    def gen(xs):
        for v in xs:
            yield v * 3

    def over_generator(xs):
        acc = torch.zeros(3)
        for v in gen(xs):
            acc = acc + v
            print("gen")
            acc = acc.sin()
        for v in (u + 1 for u in xs):
            acc = acc - v
            print("genexpr")
            acc = acc.cos()
        return acc

    xs = lambda: [torch.randn(3) for _ in range(4)]  # noqa: E731
    check(over_list, xs, min_calls=4)  # at least one graph per iteration
    check(over_enumerate_zip, xs, xs, min_calls=4)
    check(over_dict, lambda: {"a": torch.randn(3), "b": torch.randn(3), "c": torch.randn(3)}, min_calls=3)
    check(over_tensor, t(5, 3), min_calls=5)
    check(over_generator, xs, min_calls=8)


# ---- break / continue / else / return ------------------------------------------------------------
def test_break_continue_else_and_return():
    def f(x, stop):
        y = x
        out = []
        for k in range(6):
            y = y + 1
            print("k", k)
            if k == 1:
                continue
            y = y * 0.9
            if k == stop:
                out.append("break")
                break
            out.append(k)
        else:
            print("no break")
            y = -y
        return y, out

    def g(x):
        y = x
        for k in range(5):
            y = y * 1.5
            print("k", k)
            if k == 2:
                return y + 100, k
            y = y - 1
        return y, -1

    check(f, t(3), 3, min_calls=4)  # at least one graph per iteration
    check(f, t(3), 99, min_calls=6)
    check(g, t(3), min_calls=3)


def test_data_dependent_break_and_continue():
    def f(x):
        y = x * 10
        skipped = 0
        for k in range(8):
            y = y * 0.7
            if y[0] < 0:  # a tensor condition: the branch runs as Python
                skipped += 1
                continue
            if y.abs().sum() < 1:
                break
            y = y + 0.01
        return y, skipped, k
    for _ in range(3):
        check(f, t(3), min_calls=8, calls=1)


def test_nested_loops():
    def f(x):
        y = x.exp()
        for a in range(3):
            y = y * 0.5
            for b in range(2):
                print("inner", a, b)
                y = y + a * b
            y = y.tanh()
        return y.log1p()

    def g(x):  # the break is in the outer body; the inner loop is unrolled in its segment
        y = x
        for a in range(3):
            for b in range(4):
                y = y + b
            print("outer", a)
            y = y * 0.5
        return y
    check(f, t(3), min_calls=3)
    check(g, t(3), min_calls=3)


def test_while_loop_with_item_condition():
    def f(x):
        y = x.abs() + 0.1
        n = 0
        while y.sum().item() < 50 and n < 30:
            y = y * 1.3 + 0.01
            n += 1
        return y, n

    def g(x):
        y = x
        k = 0
        while True:
            y = y * 2
            k += 1
            print("round", k)
            if k >= 4:
                break
            y = y - 0.5
        return y.sigmoid()
    cnt = check(f, t(4), min_calls=5)
    assert cnt.compiled < 12  # the float condition is not a guarded constant of the segments
    check(g, t(3), min_calls=7)


# ---- calls, contexts, closures -------------------------------------------------------------------
def _logging_step(y, k):
    y = y * 2
    print("inside helper", k)  # a break inside a function the loop body calls
    return y - 1


def test_break_in_a_function_called_from_the_body():
    def f(x):
        y = x
        for k in range(4):
            y = y + 0.5
            y = _logging_step(y, k)
            y = y.tanh()
        return y
    check(f, t(3), min_calls=8)


def test_with_and_try_finally_around_the_loop():
    def f(x):
        y = x
        with torch.no_grad():
            for k in range(3):
                y = y * 2
                print("no grad", torch.is_grad_enabled())
                y = y + 1
        return y * x

    def g(x):
        y = x
        try:
            for k in range(3):
                y = y * 2
                print("k", k)
                y = y + 1
        finally:
            print("finally", y.shape)
        return y

    class Logged:
        def __init__(self):
            self.log = []

        def __enter__(self):
            self.log.append("enter")
            return self

        def __exit__(self, *exc):
            self.log.append("exit")
            return False

    def h(x):
        ctx = Logged()
        y = x
        with ctx:
            for k in range(3):
                y = y - 1
                print("in with", k)
                y = y * 3
        return y, ctx.log

    check(f, t(3, grad=True), min_calls=6)
    check(g, t(3), min_calls=6)
    check(h, t(3), min_calls=6)


class Boom(Exception):
    pass


def test_exception_from_the_body_reaches_the_handler_with_eager_state():
    def f(x):
        y = x
        k = -1
        try:
            for k in range(6):
                y = y * 2
                if y.abs().sum() > 20:
                    raise Boom(f"big at {k}")
                y = y + 0.1
        except Boom as e:
            print("caught", e, round(y.sum().item(), 3), k)
        return y
    for _ in range(3):
        check(f, t(3), min_calls=2, calls=1)


def test_closures_over_loop_state():
    def make(scale):
        def f(x):
            y = x
            fns = []
            for k in range(3):
                y = y * scale
                print("k", k)
                fns.append(lambda v, k=k: v + k)
            return [g(y) for g in fns]
        return f
    check(make(1.5), t(3), min_calls=3)


def test_recompiles_stay_bounded_for_python_scalars_in_the_loop():
    def f(x):
        y = x
        total = 0.0
        for i in range(20):
            y = y * 0.99 + 0.01
            val = y.mean().item()
            total += val
            print(f"{i} {val:.5f}")
            y = y - 0.001 * i
        return y, total
    cnt = check(f, t(8), min_calls=20)
    assert cnt.compiled <= 8, cnt.compiled


def test_explain_shows_the_per_iteration_graphs():
    def f(x):
        y = x.sin()
        for i in range(3):
            y = y * 2
            print("i", i)
            y = y + 1
        return y
    with contextlib.redirect_stdout(io.StringIO()):
        report = ember.explain(f)(torch.randn(3))
    text = str(report)
    assert "Loops that run as Python" in text, text
    (loop, numbers), = report.loops.items()
    assert "for loop at line" in loop, loop
    assert [report.graphs[n - 1].calls for n in numbers if report.graphs[n - 1].ops == ["add"]] == [3], text
    assert "graph" in text.split("Loops that run as Python")[1].splitlines()[1]


def test_a_break_in_an_inner_loop_the_driver_does_not_drive_yet():
    def f(x):
        y = x
        for a in range(3):
            print("a", a)  # the first break drives the outer loop only
            for b in range(3):
                y = y * 1.1
                if y.sum() > 0:  # met inside a segment: the inner loop gets its own driver
                    print("pos", b)
                y = y - 0.2
            y = y.tanh()
        return y
    for _ in range(3):
        check(f, t(3), min_calls=3, calls=1)


def test_while_continue_del_and_nested_return():
    def w(x, n):
        i = 0
        y = x
        while i < n:
            i += 1
            y = y + 1
            if i == 2:
                continue
            print("i", i)
            y = y * 0.5
        return y, i

    def d(x):
        y = x
        for k in range(3):
            tmp = y * 2
            print("tmp", k)
            y = tmp + 1
            del tmp
        return y

    def r(x):
        y = x
        for a in range(4):
            for b in range(4):
                y = y + 0.5
                print(a, b)
                if a * b == 2:
                    return y, a, b
        return y, -1, -1
    check(w, t(3), 5, min_calls=5)
    check(d, t(3), min_calls=3)
    check(r, t(3), min_calls=5)


def test_try_and_no_grad_inside_the_body():
    def f(x):
        y = x
        out = []
        for k in range(4):
            y = y * 1.5
            try:  # runs as Python: compiled code would skip the handler
                if k == 2:
                    raise KeyError(k)
                print("ok", k)
                y = y + 1
            except KeyError as e:
                print("caught", e)
                out.append(k)
            y = y - 0.5
        return y, out

    def g(x):
        y = x
        for k in range(3):
            y = y * 2
            with torch.no_grad():
                z = y * 3
                print("in no_grad", torch.is_grad_enabled(), k)
                z = z + 1
            y = y + z
        return y
    check(f, t(3), min_calls=4)
    check(g, t(3, grad=True), min_calls=3)


def test_uncaught_exception_and_method_loops():
    def f(x):
        y = x
        for k in range(4):
            y = y * 2
            print(k)
            if k == 2:
                raise ValueError(f"boom {k}")
        return y
    compiled = ember.compile(f, backend=CallCounter())
    for fn in (f, compiled):
        with pytest.raises(ValueError, match="boom 2"), contextlib.redirect_stdout(io.StringIO()):
            fn(torch.ones(3))

    class Base(torch.nn.Module):
        def forward(self, x):
            return x * 2

    class Child(Base):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(3)])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = super().forward(layer(x)).relu()
                print("layer", i, tuple(x.shape))
            return x
    check(Child(), t(2, 3), min_calls=3)


def test_training_loop_with_optimizer_and_logging():
    def train(steps):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, target = torch.randn(8, 4), torch.randn(8, 1)
        losses = []
        for s in range(steps):
            opt.zero_grad()
            loss = ((model(x) - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            print(f"step {s} {losses[-1]:.5f}")
        return model.weight.detach().clone(), losses
    check(train, 5, min_calls=5)
