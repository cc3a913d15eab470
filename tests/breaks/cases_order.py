"""Program order across the break: side effects made by the graph before a break must be visible
to the plain-Python code at the break (prints, disabled helpers), and mutations made by that code
must be visible to the compiled code after it."""
import torch

import ember

from .harness import case, t

LOG = []
STATS = {}
OBJ = None
BUF = None
G = 0


class Holder:
    def __init__(self):
        self.value = 0
        self.items = []


def setup():
    return {"LOG": [], "STATS": {}, "OBJ": Holder(), "BUF": torch.zeros(3), "G": 0}


@case(t, setup=setup)
def list_append_visible_to_print(x):
    LOG.append(x.shape[0])
    LOG.append("second")
    print("LOG is", LOG)
    return x * len(LOG)


@case(t, setup=setup)
def attribute_write_visible_to_print(x):
    OBJ.value = x.shape[0] * 3
    OBJ.items.append("a")
    print("value", OBJ.value, OBJ.items)
    return x + OBJ.value


@case(t, setup=setup)
def global_write_visible_to_print(x):
    global G
    G = x.shape[0] + 7
    print("G is", G)
    return x * G


@case(t, setup=setup)
def dict_tensor_value_visible_to_print(x):
    STATS["mean"] = x.mean(0)
    print("stats", STATS)
    return x - STATS["mean"]


@case(t)
def inplace_input_visible_to_item(x):
    x.add_(1)
    s = x.sum().item()
    return x * 0 + s


@case(t, setup=setup)
def copy_into_global_visible_to_print(x):
    BUF.copy_(x[0])
    print("buffer sum", round(BUF.sum().item(), 4))
    return BUF * 2


@ember.disable
def _reads_state(tag):
    return (tag, len(LOG), OBJ.value, G)


@case(t, setup=setup)
def disabled_helper_sees_pending_effects(x):
    global G
    LOG.append(1)
    OBJ.value = 5
    G = 9
    seen = _reads_state("first")
    LOG.append(2)
    return x * 2, seen, _reads_state("second")


@ember.disable
def _mutates_state(v):
    LOG.append("native")
    OBJ.value += 100
    STATS["native"] = True
    v.mul_(2)


@case(t, setup=setup)
def compiled_code_sees_native_mutations(x):
    y = x + 1
    _mutates_state(y)
    return y + len(LOG) + OBJ.value, STATS.get("native", False)


@ember.disable
def _rebinds_global():
    global G
    G = G + 10


@case(t, setup=setup)
def compiled_code_sees_native_global_rebind(x):
    global G
    G = 1
    _rebinds_global()
    return x * G, G


@case(t, setup=setup, min_graphs=2)  # the work before and after the first print
def print_of_object_mutated_in_graph_then_after(x):
    y = x * 2
    OBJ.items.append(x.shape[0])
    print("items", OBJ.items)
    OBJ.items.append(x.dim())
    print("items", OBJ.items)
    return y + 1


@case(t)
def print_of_input_list_mutation(x):
    acc = []
    acc.append(x.sum(0))
    acc.append("tag")
    print("acc len", len(acc), acc[1])
    return acc


@case(lambda n: (torch.randn(n, 3), []))
def input_list_mutation_seen_by_print(x, acc):
    acc.append(1)
    acc.extend([2, 3])
    print("acc", acc)
    acc.pop(0)
    return x * len(acc)


@case(t, setup=setup)
def many_breaks_interleaved_effects(x):
    y = x
    for_graphs = []
    LOG.append(0)
    print("b0", LOG)
    y = y + 1
    LOG.append(1)
    print("b1", LOG)
    y = y * 2
    OBJ.value += 1
    print("b2", OBJ.value)
    y = y - 3
    STATS["k"] = 4
    print("b3", STATS)
    y = y / 5
    for_graphs.append(y.shape)
    print("b4", for_graphs)
    return y


@case(t, setup=setup, min_graphs=3)
def several_graphs_expected(x):
    a = x.sin()
    print("one")
    b = a.cos()
    print("two")
    c = b.exp()
    print("three")
    return c.tanh()
