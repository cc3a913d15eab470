"""try / except / else / finally around breaks, raising inside compiled code, custom exceptions
caught by the caller or propagating out (same type, message, args and __cause__ as eager), user
context managers, state written before a raise.

Code after a break inside a ``try`` block runs as plain Python (so that the handler sees the
exception): every case has tensor work outside its try block (or loop), which must still compile."""
import contextlib

import torch

import ember

from .harness import case, t, alt

LOG = []
COUNT = 0


class CustomError(Exception):
    pass


class DetailedError(ValueError):
    def __init__(self, msg, code):
        super().__init__(msg, code)
        self.code = code


def log_setup():
    return {"LOG": [], "COUNT": 0}


@case(t)
def try_except_raise_after_print(x):
    y = x * 2
    try:
        print("in try")
        y = y + 1
        raise ValueError("bad value")
    except ValueError as e:
        print("caught", e)
        y = y - 10
    return y


def _raises_custom(v):
    print("about to raise")
    raise CustomError(f"custom {v.shape[0]}")


@case(t)
def custom_error_from_helper_caught_by_caller(x):
    y = x + 1
    try:
        _raises_custom(y)
    except CustomError as e:
        return y * 2, str(e)
    return y, "unreachable"


@case(t)
def raise_propagates_after_print(x):
    y = x * 3
    print("raising next")
    raise ValueError(f"rows={y.shape[0]}")


@case(t, setup=log_setup)
def custom_error_propagates_with_state(x):
    LOG.append("before")
    y = x.abs()
    print("mid")
    LOG.append("after print")
    if y.shape[0] > 0:
        raise DetailedError("detailed failure", 42)
    return y


@case(t, setup=log_setup)
def finally_runs_on_return(x):
    try:
        y = x * 2
        print("try body")
        return y + 1
    finally:
        LOG.append("finally")
        print("finally body")


@case(t, setup=log_setup)
def finally_runs_on_raise(x):
    global COUNT
    try:
        y = x - 1
        print("before raise")
        raise KeyError("missing")
    finally:
        COUNT += 1
        LOG.append(("finally", COUNT))


@case(alt)
def data_dependent_raise_caught(x):
    y = x * 2
    try:
        if y.sum() > 0:
            raise ValueError("positive")
        y = y - 1
    except ValueError:
        y = y + 100
    return y


@case(t, min_graphs=4)  # the work before and after the try blocks, at both sizes
def nested_try_blocks(x):
    y = x.sin()
    try:
        try:
            print("inner try")
            y = y * 2
            raise IndexError("inner")
        except IndexError as e:
            print("inner caught", e)
            y = y + 1
            raise RuntimeError("outer") from e
    except RuntimeError as e2:
        print("outer caught", e2, type(e2.__cause__).__name__)
        y = y * 3
    return y.cos()


@case(t)
def try_except_else(x):
    y = x + 1
    try:
        print("no error")
        z = y * 2
    except ZeroDivisionError:
        z = y
    else:
        print("else branch")
        z = z + 5
    return z


@case(t)
def torch_error_caught(x):
    y = x * 2
    try:
        z = y @ torch.ones(7, 2)
    except RuntimeError:
        print("shape mismatch caught")
        z = y.sum(1)
    return z


@case(t)
def keyerror_from_dict_caught(x):
    d = {"a": x}
    y = x + 1
    try:
        z = d["b"]
    except KeyError as e:
        print("missing key", e)
        z = y * 2
    return z


@case(t, min_graphs=4)
def indexerror_in_loop_continue(x):
    vals = [1.0, 2.0]
    y = x * 2
    for k in range(4):
        try:
            y = y + vals[k]
        except IndexError:
            print("no value", k)
            continue
    return y.tanh()


@case(t)
def raise_from_propagates(x):
    y = x.sum()
    try:
        print("converting")
        int("not a number")
    except ValueError as e:
        raise RuntimeError(f"wrapped {y.shape}") from e


@case(alt)
def assert_on_tensor_fails(x):
    y = x * 2
    assert (y > 0).all(), "not all positive"
    return y


@case(t)
def zero_division_from_item(x):
    y = x * 0
    k = int(y.sum().item())
    return x / 1, 1 / k


class _Ctx:
    def __init__(self, tag):
        self.tag = tag

    def __enter__(self):
        print("enter", self.tag)
        return self

    def __exit__(self, *exc):
        print("exit", self.tag, exc[0].__name__ if exc[0] else None)
        return False


@case(t)
def user_context_manager_around_break(x):
    y = x + 1
    with _Ctx("a"):
        y = y * 2
        print("inside")
    return y


@case(t)
def user_context_manager_sees_exception(x):
    y = x + 1
    try:
        with _Ctx("b"):
            y = y * 2
            raise TypeError("inside with")
    except TypeError as e:
        print("after with", e)
    return y


@case(t)
def contextlib_suppress(x):
    y = x - 1
    with contextlib.suppress(ValueError):
        print("suppressed next")
        raise ValueError("ignored")
    return y * 2


@ember.disable
def _disabled_raiser(v):
    raise CustomError(f"disabled raised {v.shape[0]}")


@case(t)
def exception_from_disabled_propagates(x):
    y = x * 2
    return _disabled_raiser(y)


@case(t)
def exception_from_disabled_caught(x):
    y = x * 2
    try:
        _disabled_raiser(y)
    except CustomError as e:
        print("caught", e)
        y = y + 1
    return y


class _RaisingSub(torch.nn.Module):
    def forward(self, x):
        print("sub forward")
        raise CustomError("sub failed")


_SUB = _RaisingSub()


@case(t)
def exception_from_submodule_caught(x):
    y = x + 1
    try:
        y = _SUB(y)
    except CustomError as e:
        print("caller caught", e)
        y = y * 2
    return y


@case(t, setup=log_setup)
def side_effects_before_raise_persist(x):
    LOG.append(1)
    y = x * 2
    LOG.append(y.shape[0])
    print("about to fail")
    LOG.append(3)
    raise CustomError("after effects")


@case(t)
def stopiteration_caught(x):
    it = iter([x])
    y = next(it) * 2
    try:
        next(it)
    except StopIteration:
        print("exhausted")
        y = y + 1
    return y


def _gen_raises(v):
    yield v
    print("generator raising")
    raise CustomError("from generator")


@case(t)
def exception_inside_generator(x):
    out = []
    try:
        for v in _gen_raises(x * 2):
            out.append(v + 1)
    except CustomError as e:
        out.append(x * 0 + len(str(e)))
    return out


@case(t)
def except_returns_str_of_error(x):
    y = x.relu()
    try:
        print("dividing")
        1 / 0
    except Exception as e:
        return y, str(e), type(e).__name__


@case(t, setup=log_setup)
def bare_reraise_after_print(x):
    y = x * 2
    try:
        raise CustomError("original")
    except CustomError:
        LOG.append("handler")
        print("reraising")
        raise


@case(t, setup=log_setup)
def finally_with_exception_caught_by_outer(x):
    y = x + 1
    try:
        try:
            print("work")
            raise CustomError("boom")
        finally:
            LOG.append("inner finally")
            y = y * 2
    except CustomError:
        LOG.append("outer except")
    return y


@case(t)
def exception_args_and_attrs(x):
    y = x * 2
    try:
        print("raising detailed")
        raise DetailedError("details", y.shape[0])
    except DetailedError as e:
        return y, e.args, e.code


@case(alt, min_graphs=2)  # torch.compile: 2
def raise_in_loop_caught_outside(x):
    y = x * 1.0 + 0.5
    try:
        for k in range(5):
            y = y * 2
            if y.sum() < 0:
                raise CustomError(f"negative at {k}")
    except CustomError as e:
        print(e)
    return y.sigmoid()


@case(t)
def shape_error_after_break_propagates(x):
    y = x * 2
    print("about to mismatch")
    return y @ torch.ones(7, 2)


@case(t)
def raise_message_with_tensor_format(x):
    y = x.abs().sum()
    print("formatting")
    raise ValueError(f"bad total {y:.3f} for {tuple(x.shape)}")


@case(alt)
def assert_message_from_tensor(x):
    y = x.sum()
    print("asserting")
    assert y > 0, f"sum was {y.item():.3f}"
    return x * 2


@case(t, setup=log_setup)
def return_in_finally_overrides(x):
    try:
        y = x * 2
        print("try")
        raise CustomError("swallowed")
    finally:
        LOG.append("finally returns")
        return x + 1  # noqa: B012


@case(t)
def index_error_from_tensor_indexing(x):
    y = x * 2
    print("indexing")
    try:
        z = y[100]
    except IndexError as e:
        return y, str(e)
    return z, ""


@case(t)
def exception_object_returned(x):
    y = x + 1
    try:
        print("in try")
        raise DetailedError("kept", 7)
    except DetailedError as e:
        err = e
    return y, err
