"""ember.export.export: the ExportedProgram it builds (signature, mutations, constants, ranges), its
interop with torch.export (save/load, module(), run_decompositions), dynamic shapes and errors."""
from __future__ import annotations

import io

import pytest
import torch

import ember
import ember.export as ee


class Counter(torch.nn.Module):
    """Parameters, a persistent buffer mutated in forward, a non-persistent buffer, a tensor made in
    forward, an in-place update of a user input, and a nested output."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("scale", torch.full((3,), 2.0), persistent=False)

    def forward(self, x, acc):
        self.count.add_(1)
        acc.mul_(2)
        y = self.lin(x) * self.scale + torch.tensor(0.5)
        return {"y": y, "parts": (x.sum(), acc + 1)}


def test_signature_lifts_state_and_records_mutations():
    m = Counter()
    ep = ee.export(m, (torch.randn(5, 4), torch.ones(2)))
    assert isinstance(ep, torch.export.ExportedProgram)
    kinds = [(s.kind.name, s.target) for s in ep.graph_signature.input_specs]
    assert kinds == [("PARAMETER", "lin.weight"), ("PARAMETER", "lin.bias"), ("BUFFER", "count"),
                     ("BUFFER", "scale"), ("CONSTANT_TENSOR", "lifted_tensor_0"), ("USER_INPUT", None),
                     ("USER_INPUT", None)]
    outs = [(s.kind.name, s.target) for s in ep.graph_signature.output_specs]
    assert outs[:2] == [("BUFFER_MUTATION", "count"), ("USER_INPUT_MUTATION", "acc")]
    assert [k for k, _ in outs[2:]] == ["USER_OUTPUT"] * 3
    assert set(ep.state_dict) == {"lin.weight", "lin.bias", "count"}      # non-persistent: a constant
    assert set(ep.constants) == {"scale", "lifted_tensor_0"}
    assert m.count.item() == 0  # exporting does not run the model's side effects for real
    # functional ATen only: every call is an OpOverload, none mutates
    for node in ep.graph.nodes:
        if node.op == "call_function":
            assert isinstance(node.target, torch._ops.OpOverload), node.target
            assert not node.target._schema.is_mutable, node.target


def test_module_matches_eager_with_mutations_and_round_trip():
    m, ref = Counter(), Counter()
    ref.load_state_dict(m.state_dict())
    ep = ee.export(m, (torch.randn(5, 4), torch.ones(2)))
    buf = io.BytesIO()
    ee.save(ep, buf)
    buf.seek(0)
    loaded = ee.load(buf)
    for mod in (ep.module(), loaded.module()):
        ref.count.zero_()
        for _ in range(2):
            x = torch.randn(5, 4)
            a1, a2 = torch.ones(2), torch.ones(2)
            got, want = mod(x, a1), ref(x, a2)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(a1, a2)          # the input mutation happened
        assert mod.count.item() == ref.count.item() == 2  # so did the buffer's


def test_run_decompositions_and_ember_compile_of_module():
    m = Counter()
    ep = ee.export(m, (torch.randn(5, 4), torch.ones(2)))
    dec = ep.run_decompositions()
    x = torch.randn(5, 4)
    torch.testing.assert_close(dec.module()(x, torch.ones(2))["y"], ep.module()(x, torch.ones(2))["y"])
    calls = []

    def backend(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    compiled = ember.compile(ep.module(), backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x, torch.ones(2))["y"], m(x, torch.ones(2))["y"])
    assert len(calls) == 1  # one graph: ep.module()'s hooks and guard function were traced through


def test_is_exporting_true_only_while_exporting():
    seen = []

    class M(torch.nn.Module):
        def forward(self, x):
            seen.append(ember.is_exporting())  # a list append: runs at trace time only
            return x + 1 if torch.compiler.is_exporting() else x - 1

    ep = ee.export(M(), (torch.ones(2),))
    assert torch.equal(ep.module()(torch.ones(2)), torch.full((2,), 2.0))
    assert not ember.is_exporting()


def test_dynamic_batch_three_sizes_and_range_checks():
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    batch = ee.Dim("batch", min=2, max=32)
    assert ee.Dim is torch.export.Dim
    ep = ee.export(m, (torch.randn(4, 4),), dynamic_shapes={"input": {0: batch}})
    (sym, rng), = ep.range_constraints.items()
    assert (int(rng.lower), int(rng.upper)) == (2, 32)
    mod = ep.module()
    for b in (2, 7, 32):
        x = torch.randn(b, 4)
        torch.testing.assert_close(mod(x), m(x))
    with pytest.raises(Exception, match=r"Guard failed: input.size\(\)\[0\] <= 32"):
        mod(torch.randn(33, 4))
    with pytest.raises(Exception, match=r"Guard failed: input.size\(\)\[1\] == 4"):   # a static dim differs
        mod(torch.randn(3, 5))


def test_dynamic_shapes_tuple_form_and_example_out_of_range():
    m = torch.nn.Linear(4, 2)
    ep = ee.export(m, (torch.randn(3, 4),), dynamic_shapes=({0: ee.Dim("b")},))
    assert len(ep.range_constraints) == 1
    with pytest.raises(ee.ExportError, match=r"Constraints violated \(b\)!.*size 40 in dimension 0, outside the range of b \[None, 16\]"):
        ee.export(m, (torch.randn(40, 4),), dynamic_shapes=({0: ee.Dim("b", max=16)},))


def test_specialized_dynamic_dim_names_the_dim():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.reshape(4, -1) if x.shape[0] == 4 else x

    with pytest.raises(ee.ExportError, match=r"Constraints violated \(batch\)!.*x\.size\(0\)"):
        ee.export(M(), (torch.randn(4, 3),), dynamic_shapes={"x": {0: ee.Dim("batch")}})


def test_bad_dynamic_shapes_name():
    with pytest.raises(ee.ExportError, match="not arguments of"):
        ee.export(torch.nn.Linear(2, 2), (torch.randn(3, 2),), dynamic_shapes={"y": {0: ee.Dim("b")}})


# ---- errors: each names the construct and the user's file:line ---------------------------------

class DataBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # LINE: data
            return x + 1
        return x - 1


class Prints(torch.nn.Module):
    def forward(self, x):
        print("value", x)  # LINE: print
        return x + 1


class ItemBranch(torch.nn.Module):
    def forward(self, x):
        if x.max().item() > 0.5:  # LINE: item
            return x * 2
        return x


def _line(tag: str) -> int:
    import inspect
    src, start = inspect.getsourcelines(inspect.getmodule(DataBranch))
    return next(i for i, line in enumerate(src, 1) if f"# LINE: {tag}" in line)


@pytest.mark.parametrize("mod,tag,what", [
    (DataBranch, "data", "branching on a tensor's value"),
    (Prints, "print", "print()"),
    (ItemBranch, "item", "Tensor.item()"),
])
def test_unsupported_construct_names_it_and_its_line(mod, tag, what):
    with pytest.raises(ee.ExportError) as info:
        ee.export(mod(), (torch.randn(3),))
    msg = str(info.value)
    assert what in msg, msg
    assert f"{__file__}:{_line(tag)}" in msg, msg
    assert f"cannot capture {mod.__name__}.forward" in msg


def test_argument_errors():
    with pytest.raises(ee.ExportError, match="must be a tuple"):
        ee.export(torch.nn.Linear(2, 2), torch.randn(3, 2))
    with pytest.raises(ee.ExportError, match="expects an nn.Module"):
        ee.export(lambda x: x, (torch.randn(2),))


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2  # INNER-LINE


class _Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Inner(), _Inner()])
        self.d = torch.nn.ModuleDict({"a": _Inner()})
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(self.d["a"](x)).sum()


def test_nodes_carry_nn_module_stack_like_torch_export():
    """nn_module_stack (torch.export's form: outermost first, "L__self__<fqn>" -> (fqn, class)),
    source_fn_stack and stack_trace on the ATen nodes; they survive save/load, and
    torch.export.unflatten (which reads nn_module_stack) rebuilds the module tree."""
    m = _Nested()
    ep = ee.export(m, (torch.randn(2, 4),))
    nodes = {n.name: n for n in ep.graph.nodes}
    inner = f"{__name__}._Inner"
    addmm, relu = nodes["addmm_1"], nodes["relu_1"]  # the second block's linear and relu
    assert addmm.meta["nn_module_stack"] == {
        "L__self__": ("", f"{__name__}._Nested"), "L__self__blocks.1": ("blocks.1", inner),
        "L__self__blocks.1.lin": ("blocks.1.lin", "torch.nn.modules.linear.Linear")}
    assert list(relu.meta["nn_module_stack"].values())[-1] == ("blocks.1", inner)
    assert list(nodes["relu_2"].meta["nn_module_stack"].values())[-1] == ("d.a", inner)
    assert list(nodes["sum_1"].meta["nn_module_stack"]) == ["L__self__"]
    assert relu.meta["source_fn_stack"][-1][1] is torch.relu
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if "# INNER-LINE" in text)
    assert f'{__file__}", line {line}, in forward' in relu.meta["stack_trace"]
    assert all("nn_module_stack" not in n.meta for n in ep.graph.nodes if n.op == "placeholder")

    buf = io.BytesIO()
    ee.save(ep, buf)
    buf.seek(0)
    loaded = {n.name: n for n in ee.load(buf).graph.nodes}
    assert loaded["addmm_1"].meta["nn_module_stack"] == addmm.meta["nn_module_stack"]
    assert loaded["relu_1"].meta["source_fn_stack"]

    flat = torch.export.unflatten(ep)
    assert isinstance(getattr(flat.blocks, "1").lin, torch.nn.Module) and hasattr(flat.d, "a")
    x = torch.randn(2, 4)
    torch.testing.assert_close(flat(x), m(x))
