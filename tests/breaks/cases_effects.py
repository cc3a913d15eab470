"""Side effects around breaks, replayed in program order: attribute writes on plain objects,
mutation of pre-existing lists / dicts / sets / deques (append, extend, pop, setitem, update, del,
sort), global and nonlocal writes, objects created in the frame and returned, in-place ops on
inputs and global tensors, counters incremented across repeated calls, aliasing of returned
containers."""
import collections
import dataclasses

import torch

from .harness import case, t, alt

LOG = []
COUNTER = 0
STATS = {}
SEEN = set()
QUEUE = collections.deque()
BUF = None
OBJ = None
GT = None
HIST = None


class Box:
    def __init__(self):
        self.count = 0
        self.last = None
        self.tags = []


class Registry:
    total = 0


@dataclasses.dataclass
class Result:
    value: torch.Tensor
    scale: float
    notes: list


def setup_all():
    return {"LOG": [], "COUNTER": 0, "STATS": {"calls": 0}, "SEEN": set(), "QUEUE": collections.deque(),
            "BUF": torch.zeros(3), "OBJ": Box(), "GT": torch.ones(3),
            "HIST": collections.defaultdict(int)}


@case(t, setup=setup_all)
def object_attribute_writes(x):
    OBJ.count += 1
    y = x * 2
    print("obj count", OBJ.count)
    OBJ.last = y.sum(0)
    OBJ.tags.append(OBJ.count)
    return y


@case(lambda n: (torch.randn(n, 3), Box()))
def input_object_attribute_writes(x, box):
    box.count = x.shape[0]
    y = x + 1
    print("box written")
    box.last = y.mean()
    box.new_attr = "created"
    return y, box


@case(t, setup=setup_all)
def list_append_before_and_after(x):
    LOG.append("start")
    y = x.abs()
    print("logged start")
    LOG.append(y.shape[0])
    LOG.append("end")
    return y


@case(t, setup=setup_all)
def list_extend_pop_insert(x):
    LOG.extend([1, 2, 3])
    y = x * 3
    print("extended")
    popped = LOG.pop()
    LOG.insert(0, popped * 10)
    del LOG[1]
    return y, popped


@case(t, setup=setup_all)
def dict_setitem_update_del(x):
    STATS["calls"] += 1
    STATS["rows"] = x.shape[0]
    y = x - 1
    print("stats", STATS["calls"])
    STATS.update({"mean": round(y.mean().item(), 5), "tmp": 1})
    del STATS["tmp"]
    return y


@case(t, setup=setup_all)
def set_add_discard(x):
    SEEN.add(x.shape[0])
    y = x.exp()
    print("seen", sorted(map(str, SEEN)))
    SEEN.add("call")
    SEEN.discard(x.shape[0] + 1000)
    return y


@case(t, setup=setup_all)
def global_counter_increments(x):
    global COUNTER
    COUNTER += 1
    y = x * COUNTER
    print("counter", COUNTER)
    COUNTER += 1
    return y + COUNTER


@case(t, setup=setup_all)
def global_tensor_rebinding(x):
    global GT
    y = x + GT
    print("rebinding")
    GT = GT * 2
    return y * GT


def make_counter():
    count = 0

    def step(x):
        nonlocal count
        count += 1
        y = x * count
        print("nonlocal count", count)
        count += 10
        return y + count

    return step


_counter_step = make_counter()


def _reset_counter_cell():
    _counter_step.__closure__[0].cell_contents = 0
    return {}


case(t, name="nonlocal_counter_across_break", setup=_reset_counter_cell,
     state=lambda _: _counter_step.__closure__[0].cell_contents)(_counter_step)


@case(t)
def object_created_in_frame_returned(x):
    y = x * 2
    print("building result")
    r = Result(value=y, scale=y.abs().max().item(), notes=[])
    r.notes.append("made")
    return r


@case(t)
def new_list_and_dict_returned(x):
    out = {"parts": []}
    for k in range(2):
        out["parts"].append(x + k)
    print("built")
    out["total"] = sum(out["parts"])
    return out


@case(t)
def inplace_on_input_before_and_after(x):
    x.add_(1)
    print("after first add")
    x.mul_(2)
    return x.sum(0)


@case(t)
def inplace_slice_assign_after_break(x):
    y = x * 2
    print("assigning")
    x[0] = y[1]
    x[:, 1] = 0.5
    return y


@case(t, setup=setup_all)
def inplace_on_global_buffer(x):
    BUF.add_(x.sum(0))
    print("buffer", BUF.shape)
    BUF.mul_(0.5)
    return x - BUF


@case(lambda n: (torch.randn(n, 3), {"seen": 0, "names": []}))
def input_dict_mutation(x, d):
    d["seen"] += 1
    y = x * 2
    print("dict input")
    d["names"].append("x")
    d["shape"] = tuple(y.shape)
    return y


@case(t, setup=setup_all)
def deque_append_appendleft(x):
    QUEUE.append(x.shape[0])
    y = x.sin()
    print("queue", len(QUEUE))
    QUEUE.appendleft("front")
    if len(QUEUE) > 4:
        QUEUE.pop()
    return y


@case(t, setup=setup_all)
def list_sort_in_place_of_floats(x):
    LOG.extend(x[:, 0].tolist())
    LOG.sort()
    y = x * 2
    LOG.reverse()
    return y


@case(t, setup=setup_all)
def side_effect_order_interleaved(x):
    LOG.append("a")
    print("p1")
    LOG.append("b")
    y = x + 1
    print("p2")
    LOG.append("c")
    OBJ.tags.append("d")
    print("p3")
    return y


@case(t, setup=setup_all)
def attribute_delete_and_setattr(x):
    OBJ.tmp = 1
    y = x * 2
    print("set tmp")
    del OBJ.tmp
    setattr(OBJ, "dyn_" + str(x.shape[0]), y.shape[1])
    return y


def _mutating_callee(v):
    LOG.append("callee start")
    print("callee")
    LOG.append("callee end")
    return v * 3


@case(t, setup=setup_all)
def mutation_inside_callee_through_break(x):
    LOG.append("caller")
    y = _mutating_callee(x)
    LOG.append("caller end")
    return y


@case(lambda n: ([torch.randn(3) for _ in range(n)],))
def inplace_on_list_element_tensor(ts):
    ts[0].mul_(2)
    print("first doubled")
    ts[-1].add_(1)
    return torch.stack(ts).sum(0)


@case(t, setup=setup_all)
def returns_global_list_itself(x):
    LOG.append(x.shape[0])
    print("returning LOG")
    return LOG, x * 2


@case(t)
def same_object_returned_twice(x):
    y = x * 2
    print("shared")
    lst = [y]
    return lst, lst, y


def _reset_registry():
    Registry.total = 0
    return {}


@case(t, setup=_reset_registry, state=lambda _: Registry.total)
def class_attribute_write(x):
    Registry.total += x.shape[0]
    print("total", Registry.total)
    Registry.total += 1
    return x * Registry.total


@case(t, setup=setup_all)
def defaultdict_counting(x):
    HIST["calls"] += 1
    y = (x > 0).sum()
    print("hist")
    HIST[int(y)] += 1
    return y


@case(alt, setup=setup_all)
def counters_in_both_branches(x):
    global COUNTER
    y = x * 2
    if y.sum() > 0:
        COUNTER += 1
        STATS["pos"] = STATS.get("pos", 0) + 1
    else:
        COUNTER -= 1
        STATS["neg"] = STATS.get("neg", 0) + 1
    return y, COUNTER


@case(lambda n: (torch.randn(n, 3), [1, 2]))
def returned_input_list_identity(x, lst):
    lst.append(x.shape[0])
    print("appended")
    lst.append(x.dim())
    return lst, x + 1


@case(t, setup=setup_all)
def global_write_then_read_after_break(x):
    global COUNTER
    COUNTER = x.shape[0] * 10
    print("written")
    return x + COUNTER, COUNTER


@case(lambda n: (torch.randn(n, 3),), setup=setup_all)
def inplace_input_then_item(x):
    x.mul_(2)
    m = x.max().item()
    x.sub_(m)
    STATS["max"] = m
    return x


def _drop_new_global():
    globals().pop("NEW_GLOBAL", None)
    return {}


@case(t, setup=_drop_new_global, state=lambda _: globals().get("NEW_GLOBAL", "<unset>"))
def global_created_inside(x):
    global NEW_GLOBAL
    NEW_GLOBAL = x.shape[0]
    print("created", NEW_GLOBAL)
    NEW_GLOBAL += 1
    return x * NEW_GLOBAL
