"""Raising and catching inside the compiled function keeps Python semantics: try/except/else/
finally, ``raise ... from``, ``__context__``, custom exception classes and their attributes."""
import pytest
import torch

from .harness import Cases, run, t

cases = Cases("exceptions")


class CodedError(ValueError):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


class Plain(Exception):
    pass


class Tagged(Plain):
    kind = "tagged"

    def __init__(self, *args):
        super().__init__(*args)
        self.first = args[0] if args else None

    @property
    def doubled(self):
        return self.first * 2

    def describe(self):
        return f"{self.kind}:{self.first}"


def x1():
    return (t(3, grad=True),)


@cases.case(x1)
def try_except_finally(x):
    log = []
    try:
        log.append("try")
        raise KeyError("k")
    except KeyError as e:
        log.append(("caught", e.args))
        y = x * 2
    else:
        log.append("else")
        y = x
    finally:
        log.append("finally")
    return y, log


@cases.case(x1)
def try_else_no_raise(x):
    log = []
    try:
        y = x + 1
    except ValueError:
        y = x - 1
    else:
        log.append("else")
    finally:
        log.append("finally")
    return y, log


@cases.case(x1)
def raise_from_and_context(x):
    info = []
    try:
        try:
            raise KeyError("inner")
        except KeyError as e:
            raise ValueError("outer") from e
    except ValueError as e2:
        info.append((type(e2.__cause__).__name__, e2.__cause__.args, e2.__suppress_context__))
        info.append(type(e2.__context__).__name__)
    try:
        try:
            raise KeyError("first")
        except KeyError:
            raise TypeError("second")  # implicit chaining: __context__ only
    except TypeError as e3:
        info.append((type(e3.__context__).__name__, e3.__cause__, e3.__suppress_context__))
    try:
        try:
            raise KeyError("a")
        except KeyError:
            raise RuntimeError("b") from None
    except RuntimeError as e4:
        info.append((e4.__cause__, e4.__suppress_context__, type(e4.__context__).__name__))
    return x * len(info), info


@cases.case(x1)
def custom_exception_attributes(x):
    try:
        raise CodedError("bad value", 7)
    except ValueError as e:
        return x * e.code, str(e), e.args, type(e).__name__, isinstance(e, CodedError)


@cases.case(x1)
def custom_exception_hierarchy(x):
    out = []
    for cls in (Plain, Tagged):
        try:
            raise cls(3, "extra")
        except Tagged as e:
            out.append((e.describe(), e.doubled, e.first, e.args))
        except Plain as e:
            out.append(("plain", e.args))
    return x + len(out), out


@cases.case(x1)
def exception_with_tensor_attribute(x):
    try:
        err = CodedError("tensor inside", 0)
        err.payload = x * 3
        raise err
    except CodedError as e:
        return e.payload + 1, e.code


@cases.case(x1)
def raise_in_called_function(x):
    def check(v):
        if v.shape[0] != 4:
            raise CodedError("wrong size", v.shape[0])
        return v

    try:
        y = check(x)
    except CodedError as e:
        y = x * e.code
    return y


@cases.case(x1)
def reraise_bare(x):
    log = []
    try:
        try:
            raise Plain("p")
        except Plain:
            log.append("inner")
            raise
    except Plain as e:
        log.append(("outer", e.args, e.__context__))
    return x - 1, log


@cases.case(x1)
def returned_exception_object(x):
    e = CodedError("kept", 5)
    return x * 2, e, e.args, e.code


@cases.case(x1)
def stop_iteration_from_next(x):
    it = iter([x])
    first = next(it)
    try:
        next(it)
    except StopIteration as e:
        return first * 2, type(e).__name__, e.args


@cases.case(x1)
def generator_raising_stop_iteration(x):
    def gen():
        yield x
        next(iter(()))  # PEP 479: leaving the generator, it is a RuntimeError
        yield x + 1

    out = []
    try:
        for v in gen():
            out.append(v * 2)
    except RuntimeError as e:
        return out, str(e)


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)


def test_uncaught_custom_exception_raises_like_eager():
    import ember

    def f(x):
        raise CodedError("boom", 9)

    with pytest.raises(CodedError) as info:
        ember.compile(f)(torch.ones(2))
    assert info.value.code == 9 and info.value.args == ("boom",)


def test_stop_iteration_inside_map_function_breaks():
    # eager: map passes the function's StopIteration on as its own, ending the consumer (list()
    # returns early): not modelled, so a graph break (never a trace that would catch it instead)
    import ember

    def f(x):
        it = iter([1])
        try:
            return list(map(lambda v: next(it) + v, [1, 2, 3])), x
        except StopIteration:
            return "caught", x

    x = torch.randn(2)
    with pytest.raises(ember.CompileError, match="StopIteration"):
        ember.compile(f, backend="eager", fullgraph=True)(x)
    assert ember.compile(f, backend="eager")(x)[0] == f(x)[0] == [2]
