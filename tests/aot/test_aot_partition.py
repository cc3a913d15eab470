"""The partitioner and its max-flow, the aot_autograd options (partition_fn, decompositions,
compilers), and the readable dumps."""
import itertools
import logging
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from aot_helpers import Recorder, close
from ember.aot import default_partition, min_cut_partition
from ember.aot.maxflow import FlowGraph, min_cut
from ember.diagnostics import logging as elog

aten = torch.ops.aten


# ------------------------------------------------------------------------------------------- max-flow

def _brute_force_cut(n, edges, s, t):
    best = float("inf")
    others = [v for v in range(n) if v not in (s, t)]
    for bits in itertools.product([0, 1], repeat=len(others)):
        side = {s} | {v for v, b in zip(others, bits) if b}
        best = min(best, sum(c for u, v, c in edges if u in side and v not in side))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_min_cut_matches_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    edges = [(u, v, float(rng.randint(1, 9))) for u in range(n) for v in range(n)
             if u != v and rng.random() < 0.35]
    g = FlowGraph()
    for v in range(n):
        g.vertex(v)
    for u, v, c in edges:
        g.add_edge(u, v, c)
    value, side = min_cut(g, 0, n - 1)
    assert value == _brute_force_cut(n, edges, 0, n - 1)
    assert 0 in side and n - 1 not in side
    # the returned side is a cut of exactly that value
    assert sum(c for u, v, c in edges if u in side and v not in side) == value


def test_min_cut_on_a_long_chain_does_not_recurse():
    g = FlowGraph()
    vs = [g.vertex(i) for i in range(20000)]
    for i in range(len(vs) - 1):
        g.add_edge(vs[i], vs[i + 1], 5.0 if i != 12345 else 2.0)
    value, side = min_cut(g, vs[0], vs[-1])
    assert value == 2.0 and vs[12345] in side and vs[12346] not in side


# ---------------------------------------------------------------------------------------- partitions

class PointwiseChain(nn.Module):
    """A matmul followed by a long pointwise tail: the tail is cheap to recompute from one saved
    tensor, but every op of it is read by its own backward formula."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x):
        h = self.lin(x)
        for _ in range(4):
            h = torch.tanh(h) * torch.sigmoid(h) + h.cos()
        return h.sum()


def _compile_step(model, rec, x):
    compiled = ember.compile(model, backend=rec)
    compiled(x).sum().backward()
    return rec.variants[0]


def test_min_cut_saves_less_than_saving_everything_and_gives_the_same_grads():
    x = torch.randn(16, 32)
    grads = {}
    summaries = {}
    for name, fn in (("min_cut", min_cut_partition), ("save_all", default_partition)):
        torch.manual_seed(0)
        model = PointwiseChain()
        variant = _compile_step(model, Recorder(partition_fn=fn), x)
        grads[name] = [p.grad for p in model.parameters()]
        summaries[name] = variant.forward.meta["ember_partition"]
    for a, b in zip(grads["min_cut"], grads["save_all"]):
        close(a, b)
    cut, naive = summaries["min_cut"], summaries["save_all"]
    assert cut.saved_bytes * 4 < naive.saved_bytes
    assert naive.saved_bytes == cut.naive_bytes
    # only the matmul output (and graph inputs, free) is kept; the pointwise tail is recomputed
    kept = [s for s in cut.saved if s.nbytes > 0]
    assert [s.name for s in kept] == ["addmm"], cut.render()
    assert len(cut.recomputed) > 10


def test_small_reduction_results_are_saved_not_recomputed():
    # a logsumexp written out: its row max and sum of exps cost a float a row to save, while
    # recomputing them is a pass over x each in the backward (the min cut alone, counting bytes only,
    # would recompute them: x is a graph input, alive anyway)
    def f(x):
        m = x.amax(-1, keepdim=True)
        return (m + (x - m).exp().sum(-1, keepdim=True).log()).sum()

    x = torch.randn(8, 1000, requires_grad=True)
    rec = Recorder()
    ember.compile(f, backend=rec)(x).backward()
    summary = rec.variants[0].forward.meta["ember_partition"]
    saved = {s.name for s in summary.saved}
    assert {"amax", "sum_1"} <= saved, summary.render()
    assert any("much smaller result" in s.reason for s in summary.saved), summary.render()
    # the backward reads them; it does not redo them (it keeps the forward's node names when it does)
    redone = [n.name for n in rec.bw_graphs[0].graph.nodes if n.op == "call_function" and n.name in saved]
    assert not redone, rec.bw_graphs[0].code
    ref = x.detach().clone().requires_grad_(True)
    f(ref).backward()
    close(x.grad, ref.grad)


def test_weight_cast_for_a_backward_matmul_is_saved():
    # under autocast the bf16 copy of a weight is read again by the backward's matmul: recomputed, it
    # would be one more copy kernel in the backward; eager keeps it, and so does the partition
    model = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    rec = Recorder()
    compiled = ember.compile(model, backend=rec)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
    out.float().sum().backward()
    summary = rec.variants[0].forward.meta["ember_partition"]
    assert any("cast of an input read by a matmul" in s.reason for s in summary.saved), summary.render()
    assert not any("_to_copy" in why for _, why in summary.recomputed + summary.deferred), summary.render()
    ref = nn.Linear(16, 16)
    ref.load_state_dict(model.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_out = ref(x)
    ref_out.float().sum().backward()
    close(model.weight.grad, ref.weight.grad)


def test_summary_explains_saved_and_recomputed_values():
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.3), nn.Linear(8, 2))
    variant = _compile_step(model, Recorder(), torch.randn(4, 8))
    text = variant.forward.meta["ember_partition"].render()
    assert "partition (min-cut)" in text
    assert "compute-bound" in text                    # the addmm is kept
    assert "random: recomputing would draw" in text   # the dropout mask is kept, never redrawn
    assert "recomputed gelu" in text                  # the activation is rebuilt in the backward
    dump = ember.aot.pipeline.describe_variant(variant)
    assert "# ----- forward" in dump and "# ----- backward" in dump and "# partition (min-cut)" in dump


def test_mutated_input_is_never_saved_for_backward():
    def f(x, w):
        x.mul_(w)
        return (x * x).sum()

    rec = Recorder()
    a = torch.randn(5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    x = a * 1
    ember.compile(f, backend=rec)(x, w).backward()   # a saved (then overwritten) x would fail here
    fw = rec.fw_graphs[0]
    placeholders = [n.name for n in fw.graph.nodes if n.op == "placeholder"]
    outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    assert placeholders[0] not in [getattr(o, "name", None) for o in outputs]
    a_ref = a.detach().clone().requires_grad_(True)
    w_ref = w.detach().clone().requires_grad_(True)
    f(a_ref * 1, w_ref).backward()
    close(a.grad, a_ref.grad)
    close(w.grad, w_ref.grad)


def test_partition_fn_option_is_used():
    calls = []

    def my_partition(joint, joint_inputs, *, num_fwd_outputs):
        calls.append(num_fwd_outputs)
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    rec = Recorder(partition_fn=my_partition)
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    ember.compile(lambda x, w: (x @ w).sum(), backend=rec)(x, w).backward()
    assert calls == [1]
    close(w.grad, x.sum(0).unsqueeze(1).expand(3, 3))
    assert rec.variants[0].forward.meta["ember_partition"].strategy == "save all"


# ------------------------------------------------------------------------------------------ options

def test_compilers_receive_functional_aten_graphs():
    rec = Recorder()
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU()).train()
    ember.compile(model, backend=rec)(torch.randn(3, 4)).sum().backward()
    for gm in rec.fw_graphs + rec.bw_graphs:
        for n in gm.graph.nodes:
            if n.op == "call_function":
                assert isinstance(n.target, torch._ops.OpOverload) or n.target.__name__ == "getitem", n.format_node()
                assert not n.target._schema.is_mutable if isinstance(n.target, torch._ops.OpOverload) else True, \
                    f"mutating op in a functional graph: {n.format_node()}"


def test_decompositions_option_extends_the_table():
    seen = []

    def gelu_as_tanh(x, approximate="none"):
        seen.append(approximate)
        return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    rec = Recorder(decompositions={aten.gelu.default: gelu_as_tanh})
    x = torch.randn(4, 6, requires_grad=True)
    out = ember.compile(lambda x: F.gelu(x, approximate="tanh"), backend=rec)(x)
    assert seen, "the extra decomposition was not used"
    targets = {n.target for n in rec.fw_graphs[0].graph.nodes if n.op == "call_function"}
    assert aten.gelu.default not in targets and aten.tanh.default in targets
    close(out, F.gelu(x, approximate="tanh"))


def test_default_table_keeps_random_ops():
    from ember.aot import default_decompositions
    from ember.aot.ops import is_random_op
    table = default_decompositions()
    assert not any(is_random_op(op) for op in table)
    assert aten.native_layer_norm_backward.default in table  # a backward op is decomposed to core ATen


# ---------------------------------------------------------------------------------------------- logs

def test_graphs_are_logged_under_the_aot_graphs_artifact(caplog):
    assert "aot_graphs" in elog.ARTIFACTS
    log = elog.get_logger("aot_graphs")
    old = log.level
    log.setLevel(logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG, logger="ember.aot_graphs"):
            w = torch.randn(3, 3, requires_grad=True)
            ember.compile(lambda x, w: (x @ w).tanh().sum(), backend="aot_eager")(torch.randn(2, 3), w)
    finally:
        log.setLevel(old)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "ember.aot_graphs")
    assert "joint graph" in text and "training variant" in text and "partition (min-cut)" in text
    assert "class forward" in text and "class backward" in text


@pytest.mark.parametrize("partition", [default_partition, min_cut_partition], ids=["default", "min_cut"])
def test_an_in_place_write_to_an_input_stays_in_the_forward(partition):
    # What functionalization did not see stays a side effect of the forward: on CUDA, batch norm's
    # decomposition wrote the running statistics with copy_ below it, and the partitioner dropped the
    # unused copy_ (ember's running statistics never moved from their initial values on the GPU)
    from torch.fx.experimental.proxy_tensor import make_fx

    def joint(x, running_mean, tangents_1):
        mean = x.mean(0)
        aten.copy_(running_mean, running_mean * 0.9 + mean * 0.1)
        y = (x - mean).relu()
        grad_x = tangents_1 * (y > 0)
        return y, grad_x

    args = [torch.randn(4, 8), torch.zeros(8), torch.randn(4, 8)]
    gm = make_fx(joint)(*args)
    fw, bw = partition(gm, num_fwd_outputs=1)
    assert any(n.target is aten.copy_.default for n in fw.graph.nodes), fw.code
    x, rm = args[0], torch.zeros(8)
    fw(x, rm)
    torch.testing.assert_close(rm, x.mean(0) * 0.1)
