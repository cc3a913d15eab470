"""Breaks inside ``nn.Module.forward`` and methods: parameters (grads compared), submodules whose
forward breaks, BatchNorm running stats in train mode, Dropout, attribute / buffer writes,
train/eval switching between calls, hooks, plain objects' methods."""
import logging

import torch
from torch import nn

import ember

from .harness import obj_case, t, alt

LOG = logging.getLogger("tests.breaks.modules")


def img(n):
    return (torch.randn(n, 2, 5, 5),)


class PrintForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)

    def forward(self, x):
        y = self.lin(x)
        print("PrintForward", tuple(y.shape))
        return torch.relu(y)


obj_case("print_in_forward", PrintForward, t)


class ItemForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        s = y.abs().max().item()
        return y / s


obj_case("item_in_forward", ItemForward, t)


class BranchForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        return self.b(x) * 2


obj_case("data_dependent_branch_in_forward", BranchForward, alt)


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        print("inner forward")
        return y.tanh()


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(3, 3)
        self.inner = Inner()
        self.post = nn.Linear(3, 2)

    def forward(self, x):
        h = self.pre(x)
        h = self.inner(h) + h
        print("outer after inner")
        return self.post(h)


obj_case("submodule_forward_breaks", Outer, t)


class PrintLayer(nn.Module):
    def forward(self, x):
        print("PrintLayer", x.shape[0])
        return x


# nn.Sequential.forward is a loop: a break inside runs the loop as plain Python, and each layer it
# calls is compiled on its own (the Linear, ReLU and Linear layers at least)
obj_case("sequential_with_printing_layer",
         lambda: nn.Sequential(nn.Linear(3, 4), PrintLayer(), nn.ReLU(), nn.Linear(4, 2)), t, min_graphs=3)


class LayerStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x).relu()
            print("layer", i, round(x.sum().item(), 4))
        return x


obj_case("modulelist_loop_print", LayerStack, t, min_graphs=3)  # each Linear layer compiled on its own


class BNPrint(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        y = self.bn(self.lin(x))
        print("bn done")
        return y * 2


obj_case("batchnorm_train_running_stats", BNPrint, t, train=True)
obj_case("batchnorm_eval", BNPrint, t, train=False)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(x)
        LOG.info("conv mean %.4f", y.mean().item())
        return self.bn(y).relu()


obj_case("conv_batchnorm_train_item_log", ConvBN, img, train=True, atol=1e-5, rtol=1e-4)


class DropPrint(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = self.drop(self.lin(x))
        print("dropout applied", self.training)
        return self.drop(y) + 1


obj_case("dropout_train_with_break", DropPrint, t, train=True)


class CountingModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0
        self.history = []

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        print("call number", self.calls)
        self.history.append(self.calls)
        self.calls += 10
        return y * self.calls


obj_case("attribute_counter_across_break", CountingModule, t)


class LastOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.last = None

    def forward(self, x):
        y = self.lin(x)
        print("storing")
        self.last = y.detach() * 2
        return y


obj_case("attribute_write_tensor_after_break", LastOutput, t)


class BufferInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(3))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.acc.add_(x.sum(0))
        self.steps += 1
        print("buffer updated")
        self.acc.mul_(0.5)
        return x + self.acc


obj_case("buffer_inplace_before_and_after_break", BufferInplace, t)


class ModeSensitive(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        y = self.bn(self.lin(x))
        if self.training:
            print("training mode")
            y = y * 2
        else:
            print("eval mode")
        return y


def _toggle_mode(m, i):
    m.train(i % 2 == 0)


obj_case("train_eval_switch_between_calls", ModeSensitive, t, before_call=_toggle_mode)


class KwForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, scale=2.0, *, shift=0.0, verbose=False):
        y = self.lin(x) * scale + shift
        if verbose:
            print("verbose forward", scale, shift)
        return y


obj_case("forward_kwargs_and_defaults", KwForward, t,
         kwargs=lambda n: {"shift": 0.25, "verbose": True})


class Stepper:
    """A plain object (not a module) whose method is compiled."""

    def __init__(self):
        self.w = torch.ones(3)
        self.count = 0
        self.log = []

    def step(self, x):
        self.count += 1
        y = x * self.w
        print("step", self.count)
        self.log.append(y.sum().item() > 0)
        self.w = self.w * 0.5
        return y


obj_case("plain_object_method", Stepper, t, method="step")


class MethodModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.seen = 0

    def helper(self, y):
        self.seen += y.shape[0]
        print("helper method", self.seen)
        return y.relu()

    def forward(self, x):
        return self.helper(self.lin(x)) + self.helper(x)


obj_case("self_method_breaks", MethodModule, t)


class NonForwardMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x)

    def score(self, x):
        y = self.forward(x)
        print("scoring")
        return y.sum(1).softmax(0)


obj_case("compiled_non_forward_method", NonForwardMethod, t, method="score")


def _hook(mod, inputs, output):
    print("forward hook", type(mod).__name__)
    return output * 2


def make_hooked():
    m = nn.Linear(3, 3)
    m.register_forward_hook(_hook)
    return m


# torch.compile compiles the Linear and the hook's work after the print
obj_case("forward_hook_prints", make_hooked, t,
         xfail="known limit: a break inside a module hook runs the whole module call eagerly "
               "(tests/breaks/FAILURES.md section 1): 0 graphs")


def make_sequential_hooked():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    m[0].register_forward_hook(_hook)
    return m


# nn.Sequential.forward is a loop run as plain Python; the ReLU is compiled on its own at both sizes
# (the hooked Linear runs eagerly, see forward_hook_prints; torch.compile compiles 4 graphs)
obj_case("sequential_with_hooked_layer", make_sequential_hooked, t, min_graphs=2)


def _pre_hook(mod, inputs):
    print("pre hook")
    return (inputs[0] + 1,)


def make_pre_hooked():
    m = nn.Linear(3, 2)
    m.register_forward_pre_hook(_pre_hook)
    return m


obj_case("forward_pre_hook_prints", make_pre_hooked, t,
         xfail="known limit: a break inside a module pre-hook runs the whole module call eagerly "
               "(tests/breaks/FAILURES.md section 1): 0 graphs")


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        h = self.enc(x).relu()
        score = h.mean().item()
        return {"h": h, "logit": self.head(h), "score": score}


obj_case("returns_dict_with_item", DictOut, t)


class DisabledSub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @ember.disable
    def forward(self, x):
        return self.lin(x) * 3


class UsesDisabledSub(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(3, 3)
        self.sub = DisabledSub()

    def forward(self, x):
        return self.sub(self.pre(x)) + x


obj_case("disabled_submodule_forward", UsesDisabledSub, t)


class ItemMiddle(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        self.b = nn.Sequential(nn.Linear(3, 3), nn.Sigmoid())

    def forward(self, x):
        y = self.a(x)
        m = y.abs().mean().item()
        return self.b(y / m)


obj_case("nested_sequential_item_middle", ItemMiddle, t)


class StepCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros((), dtype=torch.int64))
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        self.n += 1
        if self.n % 2 == 0:
            return self.lin(x) * 2
        return self.lin(x)


obj_case("buffer_counter_data_dependent", StepCounter, t)


class ResidualLN(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(3)
        self.ff = nn.Linear(3, 3)

    def forward(self, x):
        h = self.ln(x)
        LOG.info("ln done")
        return x + self.ff(h).relu()


obj_case("layernorm_residual_log", ResidualLN, t)


class ParamInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        y = x * self.w
        print("before param update")
        with torch.no_grad():
            self.w.mul_(0.9)
        return y


obj_case("parameter_inplace_under_no_grad", ParamInplace, t)


class InnerItem(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.last_norm = 0.0

    def forward(self, x):
        y = self.lin(x)
        self.last_norm = y.norm().item()
        return y


class OuterReadsInner(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = InnerItem()

    def forward(self, x):
        y = self.inner(x)
        return y / self.inner.last_norm, self.inner.last_norm


obj_case("submodule_attr_written_after_item", OuterReadsInner, t)


class GradModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(3, 5)
        self.lin2 = nn.Linear(5, 1)

    def forward(self, x):
        h = self.lin1(x).relu()
        if h.sum() > 1:
            print("large")
            h = h * 0.5
        return self.lin2(h)


obj_case("param_grads_through_branch_and_print", GradModule, alt)


class EvalModeCheck(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        print("training?", self.training, self.drop.training)
        return self.drop(self.lin(x))


obj_case("eval_mode_dropout_print", EvalModeCheck, t, train=False)


class RNNPrint(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(3, 4)

    def forward(self, x):
        h = torch.zeros(4)
        h = self.cell(x[0], h)
        print("first step")
        h = self.cell(x[1], h)
        return h


obj_case("grucell_steps_with_print", RNNPrint, t)


class PropertyModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @property
    def scale(self):
        print("scale property")
        return 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


obj_case("property_getter_breaks", PropertyModule, t)


class NewBufferInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        print("registering buffer")
        if not hasattr(self, "seen"):
            self.register_buffer("seen", torch.zeros(3))
        self.seen.add_(y.detach().sum(0))
        return y


obj_case("register_buffer_after_break", NewBufferInForward, t)


class RandomInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        noise = torch.randn_like(x)
        print("noise drawn")
        return self.lin(x + noise) + torch.rand(3)


obj_case("rng_in_forward_across_break", RandomInForward, t)
