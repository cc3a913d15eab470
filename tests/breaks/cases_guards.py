"""What the code after a break depends on changes between calls: globals / module attributes /
container lengths read after the break, grad mode / autocast / default dtype set by the caller,
input dtype / requires_grad / contiguity changing, several closures or modules sharing one code
object, functions passed as arguments, tensor hooks registered inside the compiled function."""
import functools

import torch
from torch import nn

from .harness import case, obj_case, t

SCALE = 1.0
LOG = []


def scale_setup():
    return {"SCALE": 1.0, "LOG": []}


def _bump_scale(obj, i):
    global SCALE
    SCALE = float(i + 1)


@case(t, setup=scale_setup, before_call=_bump_scale)
def global_read_after_break_changes_per_call(x):
    y = x * 2
    print("reading SCALE")
    return y * SCALE


@case(t, setup=scale_setup)
def list_length_read_after_break(x):
    LOG.append(x.shape[0])
    print("log length", len(LOG))
    if len(LOG) > 2:
        return x * len(LOG)
    return x - len(LOG)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 1.0
        self.mode = "a"

    def forward(self, x):
        y = self.lin(x)
        print("scale", self.scale, self.mode)
        if self.mode == "a":
            return y * self.scale
        return y - self.scale


def _change_module_attrs(m, i):
    m.scale = float(i)
    m.mode = "a" if i % 2 == 0 else "b"


obj_case("module_attrs_changed_between_calls", Scaled, t, before_call=_change_module_attrs)


def _alternate_grad_mode(obj, i):
    torch.set_grad_enabled(i % 2 == 0)


@case(lambda n: (torch.randn(n, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)), before_call=_alternate_grad_mode)
def caller_grad_mode_alternates(x, w):
    y = x @ w
    print("grad enabled", torch.is_grad_enabled())
    return y.relu(), torch.is_grad_enabled()


def _alternate_autocast(obj, i):
    torch.set_autocast_enabled("cpu", i % 2 == 1)


def _bf16_tol_on_autocast_calls(i):
    # calls with autocast on compute in bfloat16 (8 bits of mantissa); the others are plain fp32
    return 1e-2 if i % 2 == 1 else None


@case(lambda n: (torch.randn(n, 8), torch.randn(8, 8)), atol=_bf16_tol_on_autocast_calls,
      rtol=_bf16_tol_on_autocast_calls, before_call=_alternate_autocast)
def caller_autocast_alternates(x, w):
    y = x @ w
    print("autocast", torch.is_autocast_enabled("cpu"), y.dtype)
    return y @ w


def _alternate_default_dtype(obj, i):
    torch.set_default_dtype(torch.float64 if i % 2 == 1 else torch.float32)


@case(lambda n: (torch.randn(n, 3),), before_call=_alternate_default_dtype)
def default_dtype_changes_between_calls(x):
    a = torch.ones(3)
    print("default dtype", torch.get_default_dtype())
    b = torch.zeros(2) + 1.5
    return x.double() + a, b


@case(lambda n, i: (torch.randn(n, 3, dtype=torch.float64 if i == 3 else torch.float32),))
def input_dtype_changes(x):
    y = x * 2
    print("dtype", y.dtype)
    return y + torch.ones(3)


@case(lambda n, i: (torch.randn(n, 3, requires_grad=i >= 3),))
def input_requires_grad_changes(x):
    y = x * 2
    print("requires grad", y.requires_grad)
    return y.sum(0)


@case(lambda n, i: (torch.randn(3, n).t() if i == 3 else torch.randn(n, 3),))
def noncontiguous_input_view_after_break(x):
    y = x + 0
    print("viewing")
    return x.view(-1), y


@case(lambda n, i: (torch.randn(3, n).t() if i == 3 else torch.randn(n, 3),))
def noncontiguous_input_is_contiguous(x):
    print("contiguous?", x.is_contiguous())
    return x * 2, x.stride()


def _make_scaler(k):
    def scaler(v):
        print("scaler", k)
        return v * k
    return scaler


_S2, _S3 = _make_scaler(2.0), _make_scaler(3.0)


@case(t)
def two_closures_sharing_code(x):
    return _S2(x) + _S3(x) * 10


class Printer(nn.Module):
    def __init__(self, tag):
        super().__init__()
        self.tag = tag
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        print("printer", self.tag)
        return self.lin(x)


class TwoPrinters(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Printer("a")
        self.b = Printer("b")

    def forward(self, x):
        return self.a(x) - self.b(x)


obj_case("two_instances_sharing_forward_code", TwoPrinters, t)


@case(lambda n, i: (torch.randn(n, 3), _make_scaler(float(i + 1))))
def function_passed_as_argument(x, fn):
    y = x + 1
    return fn(y) * 2


@case(lambda n, i: (torch.randn(n, 3), Printer(f"arg{i}")))
def module_passed_as_argument(x, m):
    return m(x * 2)


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        print("calling", fn.__name__)
        out = fn(*args, **kwargs)
        print("called", fn.__name__)
        return out
    return wrapper


@_logged
def _decorated(v):
    return v * 4


@case(t)
def decorated_helper_breaks(x):
    return _decorated(x + 1) - x


@case(lambda n: (torch.randn(n, 3, requires_grad=True),))
def tensor_hook_registered_inside(x):
    y = x * 2
    y.register_hook(lambda g: g * 3)
    print("hook registered")
    return y.sin()


@case(t)
def item_value_used_after_break(x):
    k = int(x.abs().sum().item() * 2) % 3
    print("k", k)
    return x * k + k


@case(lambda n: (torch.randn(n, 3), list(range(n))))
def python_list_arg_of_varying_length(x, idx):
    print("len", len(idx))
    return x[idx[-1]] * len(idx)


@case(lambda n: (torch.randn(n, 3),))
def tensor_apply_python_callback(x):
    y = x.clone()
    y.apply_(lambda v: v * 2 + 1)
    return y, x * 2


class _PlainScaler:
    def __init__(self, k):
        self.k = k

    def apply(self, v):
        print("plain scaler", self.k)
        return v * self.k


_P2, _P3 = _PlainScaler(2.0), _PlainScaler(3.0)


@case(t)
def two_objects_sharing_method_code(x):
    return _P2.apply(x) + _P3.apply(x) * 10


def _scale_by(v, k):
    print("partial scale", k)
    return v * k


_PA, _PB = functools.partial(_scale_by, k=2.0), functools.partial(_scale_by, k=3.0)


@case(t)
def two_partials_sharing_function(x):
    return _PA(x) + _PB(x) * 10


@case(t)
def two_closures_swapped_order(x):
    return _S3(x) * 10 + _S2(x)


@case(lambda n, i: (torch.randn(n, 3), _S2 if i % 2 == 0 else _S3))
def closure_argument_alternates(x, fn):
    return fn(x * 2) + 1


def _helper_a(v):
    print("helper a")
    return v + 1


def _helper_b(v):
    print("helper b")
    return v - 1


HELPER = _helper_a


def helper_setup():
    return {"HELPER": _helper_a}


def _swap_helper(obj, i):
    global HELPER
    HELPER = _helper_a if i % 2 == 0 else _helper_b


@case(t, setup=helper_setup, before_call=_swap_helper)
def global_helper_swapped_between_calls(x):
    y = x * 2
    print("calling HELPER")
    return HELPER(y) * 3


class SwapAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = nn.ReLU()

    def forward(self, x):
        y = self.lin(x)
        print("activation", type(self.act).__name__)
        return self.act(y)


def _swap_act(m, i):
    m.act = nn.ReLU() if i % 2 == 0 else nn.Tanh()


obj_case("submodule_swapped_between_calls", SwapAct, t, before_call=_swap_act)
