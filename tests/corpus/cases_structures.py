"""Dataclasses, namedtuples, dicts of tensors, OrderedDict/defaultdict and nested structures as
inputs and outputs: rebuilt exactly (same type, same fields)."""
import collections
import dataclasses
import typing

import torch

from .harness import case

Point = collections.namedtuple("Point", ["x", "y"])


class Output(typing.NamedTuple):
    logits: torch.Tensor
    loss: torch.Tensor
    n: int = 0


@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    mask: torch.Tensor
    scale: float = 1.0


@dataclasses.dataclass
class Result:
    value: torch.Tensor
    aux: dict
    tag: str = "r"
    extra: typing.Optional[torch.Tensor] = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    k: int


class Holder:
    pass


def two():
    return (torch.randn(3), torch.randn(3))


@case(two)
def namedtuple_build_return(a, b):
    return Point(a + b, a - b)


@case(two)
def namedtuple_kwargs_and_access(a, b):
    p = Point(y=b, x=a)
    q = p._replace(x=p.x * 2)
    return q, p.x + p[1], p._fields, q._asdict()


@case(lambda: (Point(torch.randn(3), torch.randn(3)),))
def namedtuple_input_unpack(p):
    x, y = p
    return Point(y, x), len(p), isinstance(p, tuple)


@case(two)
def typed_namedtuple_with_default(a, b):
    return Output(a @ b, (a - b).pow(2).mean()), Output(a, b, 3)


@case(lambda: (Output(torch.randn(4), torch.tensor(0.5), 2),))
def typed_namedtuple_input(o):
    return o.logits * o.n + o.loss, o.n, type(o).__name__


@case(lambda: (Batch(torch.randn(2, 3), torch.rand(2, 3) > 0.5, 2.0),))
def dataclass_input(b):
    return b.inputs.masked_fill(b.mask, 0.0) * b.scale


@case(two)
def dataclass_build_return(a, b):
    return Result(a * b, {"s": a.sum(), "k": 3})


@case(two)
def dataclass_with_optional_field_and_replace(a, b):
    r = Result(a, {}, tag="x", extra=b)
    r2 = dataclasses.replace(r, value=a + 1)
    return r, r2


@case(two)
def dataclass_fields_and_asdict(a, b):
    r = Result(a, {"b": b})
    return [f.name for f in dataclasses.fields(r)], dataclasses.is_dataclass(r), Batch(a, b > 0).scale


@case(two)
def dataclass_attribute_mutation_on_new(a, b):
    r = Result(a, {})
    r.value = r.value * 2
    r.aux["x"] = b
    r.tag = r.tag + "!"
    return r


@case(two)
def dataclass_frozen(a, b):
    f = Frozen(a + b, 3)
    return f, f.a * f.k


@case(two)
def dict_of_tensors_return(a, b):
    return {"sum": a + b, "prod": a * b, "n": 2}


@case(two)
def ordered_dict_return(a, b):
    d = collections.OrderedDict()
    d["z"] = a
    d["a"] = b
    d.move_to_end("z")
    return d


@case(two)
def defaultdict_usage(a, b):
    d = collections.defaultdict(list)
    d["x"].append(a)
    d["x"].append(b)
    d["y"].append(a * b)
    return dict(d), len(d["x"]), d


@case(lambda: ({"enc": {"w": torch.randn(3), "b": torch.randn(3)}, "dec": [torch.randn(3), 2.0]},))
def nested_input_structure(cfg):
    h = cfg["enc"]["w"] * 2 + cfg["enc"]["b"]
    dec_t, dec_s = cfg["dec"]
    return {"h": h, "out": (h * dec_s + dec_t, [dec_s])}


@case(two)
def nested_output_namedtuple_in_dataclass_in_dict(a, b):
    return {"res": Result(a, {"p": Point(a, b)}), "pts": [Point(b, a), Point(a * 2, 3)]}


@case(two)
def counter_and_deque(a, b):
    c = collections.Counter("abca")
    dq = collections.deque([a, b])
    dq.appendleft(a * b)
    dq.append(b * 2)
    first = dq.popleft()
    return first + dq[0], c["a"], list(dq), len(dq)


@case(lambda: (torch.randn(3),))
def user_object_returned_with_attrs(x):
    h = Holder()
    h.t = x * 2
    h.n = 1
    return h.t + h.n, h.n, h


@case(lambda: ((torch.randn(2), (torch.randn(2), [torch.randn(2)])),))
def deeply_nested_tuple_input(t):
    a, (b, [c]) = t
    return ((a + b,), [c, {"k": (a, c)}])


@dataclasses.dataclass
class Normalized:
    raw: torch.Tensor
    eps: float = 1e-5
    mean: typing.Optional[torch.Tensor] = None

    def __post_init__(self):
        self.mean = self.raw.mean()
        self.raw = self.raw - self.mean

    def scaled(self, k):
        return self.raw * k + self.eps


@case(two)
def dataclass_post_init_and_method(a, b):
    n = Normalized(a * b)
    return n, n.scaled(2.0)


@case(lambda: ([Point(torch.randn(2), torch.randn(2)) for _ in range(3)],))
def list_of_namedtuples_input(points):
    xs = torch.stack([p.x for p in points])
    ys = torch.stack([p.y for p in points])
    return Point(xs.sum(0), ys.sum(0)), [type(p).__name__ for p in points]
