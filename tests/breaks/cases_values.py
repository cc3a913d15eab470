"""Breaks that need a tensor's data: .item(), .tolist(), int()/float()/bool(), numpy, C functions
(zlib, math, struct, hashlib), unsupported builtins, data-dependent output shapes."""
import hashlib
import math
import random
import struct
import zlib

import numpy as np
import torch

from .harness import case, t


def t2(n):
    return (torch.randn(n, 3), torch.randn(n, 3))


@case(t)
def item_scale(x):
    y = x + 1
    s = y.sum().item()
    return y * s


@case(t)
def item_python_arith(x):
    y = x * 2
    v = y.abs().max().item()
    k = round(v * 10) % 7
    return y + k, k


@case(t)
def item_returned_string(x):
    y = x.exp()
    return f"{y.sum().item():.3f}", y * 2


@case(lambda n: (torch.arange(n * 3).reshape(n, 3),))
def item_int_tensor(x):
    y = x * 2
    s = y.sum().item()
    return y - s, s, type(s).__name__


@case(t)
def item_bool_tensor(x):
    y = x.sin()
    if (y > 0.5).any().item():
        return y * 2
    return y - 2


@case(t)
def item_of_indexed_element(x):
    y = x * 3
    first = y[0, 0].item()
    last = y[-1, -1].item()
    return y + first - last


@case(t)
def tolist_sum(x):
    y = (x * 4).round()
    lst = y.tolist()
    return sum(sum(r) for r in lst), y * 2


@case(t)
def tolist_nested_returned(x):
    y = (x * 10).round() / 10
    return y.tolist(), y.t()


@case(t)
def tolist_then_tensor(x):
    y = x.abs() + 1
    back = torch.tensor(y.tolist())
    return back * 2 + y


@case(lambda n: (torch.randint(0, 5, (n,)),))
def tolist_as_python_indices(idx):
    names = ["a", "b", "c", "d", "e"]
    j = idx + 0
    picked = [names[i] for i in j.tolist()]
    return "".join(picked), j * 2


@case(t)
def int_of_tensor(x):
    y = x.abs() * 3
    k = int(y.sum()) % 4
    return y + k, k


@case(t)
def float_of_tensor(x):
    y = x * 0.5
    f = float(y.mean())
    return y - f, f


@case(t)
def bool_of_tensor(x):
    y = x.cos()
    b = bool(y.sum() > 2.0)
    return y * (1 if b else -1), b


@case(t, breaks=False)  # numpy on tensors is traced since issue 26: one graph, no break
def numpy_method_roundtrip(x):
    y = x * 2
    a = y.numpy()
    b = a * 3 + 1
    return torch.from_numpy(b) + y


@case(t)
def np_sum_of_numpy(x):
    # (integer values: np.sum is traced as a torch sum since issue 26, whose float32 rounding may
    # differ from NumPy's pairwise sum in the last bit; float(s) is still the break)
    y = (x * 4).round() + 1
    s = np.sum(y.numpy())
    return y / float(s), float(s)


@case(t)
def np_asarray_of_tensor(x):
    y = x.abs()
    arr = np.asarray(y)
    m = float(arr.max())
    return y / m


@case(t)
def np_mean_of_tolist(x):
    y = x - 1
    m = np.mean(y.tolist())
    return y - float(m)


@case(t, breaks=False)  # numpy on tensors is traced since issue 26: one graph, no break
def numpy_array_returned(x):
    y = (x * 100).round()
    return y.numpy().copy(), y + 1


@case(t)
def zlib_crc32_of_bytes(x):
    y = (x * 100).round().to(torch.int32)
    crc = zlib.crc32(y.numpy().tobytes())
    return y + 1, crc


@case(t)
def math_fsum_of_tolist(x):
    y = x * x
    s = math.fsum(y.reshape(-1).tolist())
    return y / s, s


@case(t)
def math_sqrt_of_item(x):
    y = x.sum(1)
    r = math.sqrt(abs(y.sum().item()))
    return y * r


@case(t)
def struct_pack_of_item(x):
    y = x.mean()
    packed = struct.pack("<f", y.item())
    return struct.unpack("<f", packed)[0], x - y


@case(t)
def hashlib_digest(x):
    y = (x * 10).round().to(torch.int64)
    h = hashlib.sha256(y.numpy().tobytes()).hexdigest()[:8]
    return h, y * 2


@case(t)
def builtin_eval(x):
    y = x * 2
    k = eval("a * 3 + 1", {"a": x.shape[0]})
    return y + k


@case(t)
def builtin_repr_of_tensor(x):
    y = (x * 2).round()
    text = repr(y)
    return len(text) > 0, y + 1


@case(t)
def builtin_str_of_scalar_tensor(x):
    y = x.sum().round()
    s = str(y)
    return s, y * 2


@case(t)
def builtin_sorted_tolist(x):
    y = x * 3
    order = sorted(y[:, 0].tolist())
    return order, y - 1


@case(t)
def builtin_chr_of_argmax(x):
    y = x.sum(1)
    c = chr(65 + int(y.argmax()))
    return c, y


@case(t)
def builtin_divmod_hex(x):
    y = (x.abs() * 50).round()
    q, r = divmod(int(y.sum()), 7)
    return hex(q), r, y - r


@case(t)
def builtin_format_item(x):
    y = x.std()
    return format(y.item(), ".2e"), x / y


@case(t)
def builtin_bytearray(x):
    y = (x * 10).round().to(torch.uint8)
    ba = bytearray(y.numpy().tobytes())
    return len(ba), sum(ba) % 256, y + 1


@case(t)
def random_instance_c_method(x):
    rng = random.Random(x.shape[0])
    y = x * rng.random()
    return y


@case(t)
def nonzero_dynamic_shape(x):
    y = x * 2
    idx = (y > 0).nonzero()
    print(len(idx))
    return idx, y


@case(t)
def boolean_mask_dynamic_shape(x):
    y = x + 0.5
    pos = y[y > 0]
    return pos.sum(), pos.shape[0], y


@case(lambda n: (torch.randint(0, 3, (n, 3)),))
def unique_dynamic_shape(x):
    y = x * 2
    u = torch.unique(y)
    return u, len(u)


@case(t2)
def several_item_calls(x, y):
    a = (x * y).sum().item()
    z = x + y
    b = z.max().item()
    w = z * a
    c = w.min().item()
    return w + b - c, a, b, c


@case(t)
def rng_calls_around_break(x):
    a = torch.rand(3)
    print("between random draws")
    b = torch.randn_like(x)
    return x * a + b


@case(t)
def manual_seed_inside_then_break(x):
    torch.manual_seed(123)
    a = torch.rand(3)
    s = a.sum().item()
    b = torch.rand(3)
    return x + a - b, s


def _py_random_setup():
    random.seed(7)
    return {}


@case(t, setup=_py_random_setup, state=lambda _: random.getstate())
def python_global_random(x):
    y = x * 2
    r = random.random()
    k = random.randint(1, 5)
    return y * r + k
