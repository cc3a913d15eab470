"""The compiled function's own signature and nature: keyword arguments, unsupplied defaults,
keyword-only arguments, *args/**kwargs at the top level, top-level closures (free variables),
bound methods and lambdas as the compiled callable."""
import torch

from .harness import case


def vec():
    return (torch.randn(4),)


@case(vec, kwargs=lambda: {"scale": 3.0, "bias": torch.randn(4)})
def kwargs_supplied(x, scale=1.0, bias=None):
    y = x * scale
    if bias is not None:
        y = y + bias
    return y


@case(vec)
def defaults_not_supplied(x, scale=2.0, bias=None, names=("a", "b")):
    return x * scale + (0 if bias is None else bias), names


@case(vec, kwargs=lambda: {"mode": "double"})
def keyword_only_entry(x, *, mode, eps=1e-5):
    if mode == "double":
        return x * 2 + eps
    return x


@case(lambda: (torch.randn(4), torch.randn(4), torch.randn(4)))
def varargs_entry(*tensors):
    return sum(tensors), len(tensors)


@case(vec, kwargs=lambda: {"alpha": 0.5, "beta": torch.ones(4), "gamma": 3})
def varkw_entry(x, **options):
    y = x * options["alpha"] + options["beta"]
    return y * options.get("gamma", 1), sorted(options)


@case(lambda: (torch.randn(4), 1.0, 2.0), kwargs=lambda: {"k": 4, "flag": True})
def everything_entry(x, a, *rest, k=1, flag=False, **extra):
    y = x * a + sum(rest) * k
    return (-y if flag else y), rest, extra


@case(lambda: (torch.randn(4), None, None))
def optional_tensors_none(x, mask, bias):
    if mask is not None:
        x = x * mask
    if bias is not None:
        x = x + bias
    return x


@case(lambda: (torch.randn(4), torch.rand(4) > 0.5, None))
def optional_tensors_mixed(x, mask, bias):
    if mask is not None:
        x = x.masked_fill(mask, 0.0)
    if bias is not None:
        x = x + bias
    return x


def _make_closure_over_values():
    k = 3
    table = {"shift": 0.5}
    w = torch.linspace(0, 1, 4)

    def closure_entry(x):
        return x * k + table["shift"] + w
    return closure_entry


case(vec)(_make_closure_over_values())


def _make_closure_over_function():
    act = torch.nn.functional.silu

    def helper(v):
        return v * 2

    def closure_over_callables(x):
        return act(helper(x))
    return closure_over_callables


case(vec)(_make_closure_over_function())


class _Model:
    def __init__(self):
        self.weight = torch.linspace(-1, 1, 4)
        self.scale = 2.0

    def predict(self, x, offset=0.0):
        return (x * self.weight).sum() * self.scale + offset


_model = _Model()
case(vec, kwargs=lambda: {"offset": 1.5}, name="bound_method_entry")(_model.predict)

_lambda_entry = lambda x, n=2: x ** n + 1  # noqa: E731
case(vec, name="lambda_entry")(_lambda_entry)


@case(lambda: (torch.randn(3, 4),), kwargs=lambda: {"dim": -1, "keepdim": True})
def kwargs_forwarded_to_torch(x, **kw):
    return x.sum(**kw), torch.softmax(x, dim=kw["dim"])


@case(lambda: (torch.randn(4), [1, 2, 3], {"a": 1.5}))
def python_containers_as_args(x, sizes, cfg):
    return x * len(sizes) + cfg["a"], sizes[-1]
