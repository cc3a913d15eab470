"""In-place tensor ops on inputs (the mutated input must equal eager's), setitem on inputs,
mutation through views, mutation of input Python containers, returning inputs unchanged."""
import torch
import torch.nn.functional as F

from .harness import case


def t34():
    return (torch.randn(3, 4),)


def two34():
    return (torch.randn(3, 4), torch.randn(3, 4))


@case(t34)
def inplace_add_(x):
    x.add_(1)
    return x


@case(t34)
def inplace_add_no_return(x):
    x.add_(2.5)


@case(two34)
def inplace_mul_returns_other(x, y):
    x.mul_(y)
    return y * 2


@case(t34)
def inplace_chain(x):
    x.mul_(2).add_(1).clamp_(-1, 1)
    return x.sum()


@case(t34)
def inplace_setitem_int(x):
    x[0] = 5
    return x


@case(t34)
def inplace_setitem_slice_tensor(x):
    x[:, 1:3] = torch.ones(3, 2)
    x[1] = x[2] * 2
    return x.sum(0)


@case(lambda: (torch.randn(5, 3), torch.rand(5, 3) > 0.5))
def inplace_setitem_mask(x, m):
    x[m] = 0.0
    return x


@case(lambda: (torch.randn(5, 3), torch.tensor([0, 3])))
def inplace_setitem_index_tensor(x, idx):
    x[idx] = -1.0
    x[..., 0] = 7.0
    return x


@case(t34)
def inplace_torch_relu_(x):
    torch.relu_(x)
    return x * 2


@case(t34)
def inplace_functional_inplace(x):
    F.relu(x, inplace=True)
    x.sigmoid_()
    F.leaky_relu_(x, 0.2)
    return x


@case(t34)
def inplace_method_family(x):
    x.sub_(0.5)
    x.div_(2)
    x.pow_(2)
    x.sqrt_()
    x.neg_()
    x.exp_()
    x.clamp_(max=0.9)
    return x


@case(t34)
def inplace_zero_fill(x):
    y = x[0]
    x.zero_()
    return y


@case(t34)
def inplace_fill_scalar(x):
    x.fill_(3.0)
    return x + 1


@case(t34)
def inplace_through_view(x):
    v = x[1]
    v.mul_(10)
    x.t()[0].add_(1)
    return x


@case(t34)
def inplace_through_reshape_view(x):
    v = x.view(-1)
    v[::2] = 0.0
    return v, x


@case(two34)
def inplace_copy_(x, y):
    x.copy_(y * 3)
    return x is not y


@case(two34)
def inplace_augmented_on_input(x, y):
    x += y
    x *= 2
    y -= 1
    return x, y


@case(lambda: (torch.randn(3, 4), torch.randn(3, 4)))
def inplace_after_read(x, y):
    before = x * 1
    x.add_(y)
    after = x * 1
    return before, after


@case(t34)
def inplace_masked_fill_index_put(x):
    x.masked_fill_(x > 0.5, 0.5)
    x.index_put_((torch.tensor([0]), torch.tensor([1])), torch.tensor(9.0))
    x.index_fill_(1, torch.tensor([3]), -2.0)
    return x


@case(lambda: (torch.zeros(3, 5), torch.randint(0, 5, (3, 2))))
def inplace_scatter_(x, idx):
    x.scatter_(1, idx, 1.0)
    x.scatter_add_(1, idx, torch.ones(3, 2))
    return x


@case(lambda: (torch.randint(0, 10, (6,)),))
def inplace_int_tensor(x):
    x.add_(3)
    x.bitwise_and_(7)
    x[0] = -1
    return x


@case(lambda: (torch.randn(3), torch.randn(3), torch.randn(3)))
def inplace_one_of_many(a, b, c):
    b.mul_(a)
    return a + c


@case(lambda: ([torch.randn(2), torch.randn(2)],))
def inplace_tensor_inside_list_input(xs):
    xs[0].add_(1)
    return xs[1] * 2


@case(lambda: ({"w": torch.randn(3), "b": torch.randn(3)},))
def inplace_tensor_inside_dict_input(d):
    d["w"].mul_(2)
    return d["w"] + d["b"]


@case(lambda: ([torch.randn(2), torch.randn(2)],))
def mutate_input_list(xs):
    xs.append(xs[0] + xs[1])
    xs[0] = xs[0] * 0
    return len(xs)


@case(lambda: ({"a": torch.randn(2)},))
def mutate_input_dict(d):
    d["b"] = d["a"] * 2
    d["a"] = d["a"] + 1
    d.pop("a")
    return d["b"].sum()


@case(lambda: (torch.randn(3, 4),))
def inplace_on_local_clone_leaves_input(x):
    y = x.clone()
    y.add_(1)
    y[0] = 0
    return y


# ---- returning inputs, constants, nested structures ------------------------------------

@case(t34)
def return_input_unchanged(x):
    return x


@case(two34)
def return_inputs_swapped(x, y):
    return y, x


@case(two34)
def return_input_and_new(x, y):
    return x, x + y, y


@case(lambda: (torch.randn(3), 4))
def return_python_arg(x, n):
    return n


@case(t34)
def return_constant(x):
    return 42


@case(t34)
def return_none(x):
    return None


@case(t34)
def return_constant_structure(x):
    return {"a": (1, 2.5, "s"), "b": [None, True], "c": torch.float32}


@case(lambda: (torch.randn(3), 2))
def return_nested_mixed(x, n):
    return {"out": [x * n, (x + 1, n + 1)], "meta": {"n": n, "shape": x.shape, "name": "y"}, "none": None}


@case(t34)
def return_same_tensor_twice(x):
    y = x + 1
    return y, y, [y]


@case(t34)
def return_view_of_input(x):
    return x[0], x.t(), x.view(12)


@case(t34)
def return_empty_containers(x):
    return (), [], {}, x.sum()


# ---- aliased inputs ----------------------------------------------------------------------

def _same_tensor_twice():
    t = torch.randn(3, 4)
    return (t, t)


def _base_and_view():
    t = torch.randn(3, 4)
    return (t, t[1])


@case(_same_tensor_twice)
def aliased_inputs_mutate_one(x, y):
    x.add_(1)
    return y * 2, x is y


@case(_same_tensor_twice)
def aliased_inputs_read_only(x, y):
    return x + y, x is y


@case(_base_and_view)
def input_is_view_of_other_input(base, row):
    row.mul_(10)
    return base.sum(0), row


@case(lambda: (torch.randn(3, 4),))
def mutate_then_read_view_taken_before(x):
    v = x[:, 0]
    x.mul_(2)
    w = v + 1
    x[:, 0] = 0
    return w, v


# ---- out=, grad-state changes, decorated entry --------------------------------

@case(lambda: (torch.randn(3, 4), torch.randn(3, 4), torch.zeros(3, 4)))
def out_argument_on_input(a, b, out):
    torch.add(a, b, out=out)
    torch.mul(out, 2, out=out)
    return out.sum()


@case(lambda: (torch.randn(3), torch.randn(3, requires_grad=True)))
def inplace_makes_input_require_grad(x, w):
    x.mul_(w)
    return x.requires_grad, x.is_leaf, x * 2


@case(lambda: (torch.randn(3, 4),))
def return_input_list_identity_sensitive(x):
    xs = [x, x * 2]
    return xs, xs[0] is x


@torch.no_grad()
def no_grad_decorated_entry(x, w):
    return x @ w, torch.is_grad_enabled()


case(lambda: (torch.randn(2, 3), torch.randn(3, 2, requires_grad=True)),
     name="no_grad_decorated_entry")(no_grad_decorated_entry)
