"""Breaks on output side effects: print (text and order), sys.stdout.write, logging, warnings."""
import logging
import sys
import warnings

import torch

from .harness import case, t

LOG = logging.getLogger("tests.breaks.print")


def t2(n):
    return (torch.randn(n, 3), torch.randn(n, 3))


@case(t)
def print_between_ops(x):
    y = x + 1
    print("between")
    return y * 2


@case(t)
def print_at_start(x):
    print("start", x.shape[0])
    return torch.relu(x) - 1


@case(t)
def print_at_end(x):
    y = x.sin() + x.cos()
    z = y * y
    print("end")
    return z


@case(t)
def print_intermediate_tensor(x):
    y = (x * 3).round()
    print(y)
    return y + 1


@case(t)
def print_multiple_args_sep_end(x):
    y = x.abs()
    print("a", 1, 2.5, None, "b", sep="|", end=";\n")
    return y.sum(0)


@case(t)
def print_fstring_shape(x):
    y = x.reshape(-1)
    print(f"shape={tuple(x.shape)} numel={y.numel()} dim={x.dim()}")
    return y.exp()


@case(t)
def print_item_formatted(x):
    y = x * x
    print(f"sum={y.sum().item():.4f}")
    return y - 1


@case(t)
def print_three_breaks_order(x):
    print("one")
    y = x + 1
    print("two", y.shape)
    z = y * 2
    print("three")
    return z - y


def _helper_prints(v, tag):
    print("helper", tag)
    return v * 2


@case(t)
def print_order_with_helper(x):
    print("before")
    y = _helper_prints(x, "a")
    print("middle")
    z = _helper_prints(y + 1, "b")
    print("after")
    return z


@case(t)
def print_in_return_expression(x):
    y = x * 5
    return print("ret") or y


@case(t)
def print_to_file_kw(x):
    y = x.tanh()
    print("to stdout", file=sys.stdout)
    return y


@case(t)
def stdout_write(x):
    y = x - 2
    sys.stdout.write("raw write\n")
    return y.neg()


@case(t)
def print_flush(x):
    y = x.sigmoid()
    print("flushed", flush=True)
    return y * 4


@case(t2)
def print_list_of_tensors(x, y):
    z = x + y
    print([z.shape, (x * 2).round().tolist()[0]])
    return z


@case(t)
def print_dict_and_tuple(x):
    y = x.mean(0)
    print({"a": 1, "b": [1, 2]}, (3, "x"))
    return y


@case(t)
def print_dtype_device(x):
    y = x.double()
    print(y.dtype, y.device, y.requires_grad)
    return y * 2


class _Pretty:
    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return f"Pretty({self.v})"


@case(t)
def print_user_repr(x):
    p = _Pretty(x.shape[0])
    y = x * 2
    print(p, repr(p))
    return y


@case(t)
def print_str_format(x):
    y = x.max()
    print("max {:.3f} min {:.3f}".format(y.item(), x.min().item()))
    return y + x


@case(t)
def print_via_lambda(x):
    show = lambda v: print("lam", v.shape)  # noqa: E731
    y = x + 3
    show(y)
    return y / 3


@case(t)
def print_python_scalar_from_shape(x):
    k = x.shape[0] * 2
    print(k, k + 1)
    return x.repeat(2, 1)


@case(t)
def logging_info(x):
    y = x * 2
    LOG.info("info %d", 3)
    return y + 1


@case(t)
def logging_warning_tensor_format(x):
    y = x.abs()
    LOG.warning("mean=%.3f", y.mean())
    return y.sqrt()


@case(t)
def logging_debug_and_error(x):
    LOG.debug("debug %s", "one")
    y = x.cumsum(0)
    LOG.error("error %s", tuple(y.shape))
    return y


@case(t)
def logging_and_print_interleaved(x):
    print("p1")
    LOG.info("l1")
    y = x + 1
    print("p2")
    LOG.info("l2 %s", y.shape[0])
    return y


def _helper_logs(v):
    logging.getLogger("tests.breaks.helper").info("helper sees %d rows", v.shape[0])
    return v.flip(0)


@case(t)
def logging_in_helper(x):
    y = x * 3
    z = _helper_logs(y)
    return z - x


@case(t)
def logging_getlogger_inside(x):
    log = logging.getLogger("tests.breaks.inside")
    y = x.clamp(-0.5, 0.5)
    log.info("clamped")
    return y


@case(t)
def warnings_warn(x):
    y = x * 2
    warnings.warn("careful here")
    return y + 1


@case(t)
def warnings_warn_category(x):
    y = x.exp()
    warnings.warn(f"rows {x.shape[0]}", RuntimeWarning)
    return y.log()


def _deep2(v):
    print("deep2")
    return v + 2


def _deep1(v):
    print("deep1 before")
    w = _deep2(v * 2)
    print("deep1 after")
    return w


@case(t)
def print_in_nested_helpers(x):
    y = x - 1
    z = _deep1(y)
    print("top")
    return z * y


@case(lambda n: (torch.randn(n, 3), n))
def print_python_int_arg(x, k):
    print("k is", k)
    return x * k
