"""Turn a frontend capture into a ``torch.export.ExportedProgram``.

Steps (the recipe of /work/shared/design/export-brief.md, section 1):

1. Order the program's inputs as torch.export does: every parameter, every buffer, lifted tensor
   constants, then the flattened user inputs (``in_spec`` order). Each placeholder of the captured
   graph is matched to one of them by identity of its real example value.
2. Trace the captured graph to functional ATen with ember's autograd layer (``ember.aot.functional``:
   the same Python functionalization and ``make_fx`` trace as ``ember.aot.trace``), on fake inputs
   that keep the frontend's size symbols, so one program serves every size its Dims allow. The traced
   function returns the new values of mutated inputs first, then the flattened user outputs.
3. Lift the tensor constants ``make_fx`` left as ``get_attr`` to inputs, name the placeholders
   (``p_``/``b_``/``c_`` + FQN, user inputs after the forward's arguments), and write the graph
   signature, the range constraints and the root module-call entry.
"""
from __future__ import annotations

import inspect
import re

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses import FakeTensorMode
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (ConstantArgument, ExportGraphSignature, InputKind, InputSpec, OutputKind,
                                          OutputSpec, TensorArgument)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._sympy.value_ranges import ValueRanges

from ember.aot.analysis import symbolic_dispatch, symbolic_templates
from ember.aot.functional import from_fun, functionalize, mutation_of, to_fun
from ember.export.capture import Capture, ExportError


class _Input:
    """One input of the exported program: what it is, where its value lives, and its fake."""

    def __init__(self, kind: InputKind, name: str, value, target: str | None = None, persistent: bool | None = None):
        self.kind, self.name, self.value, self.target, self.persistent = kind, name, value, target, persistent
        self.fake = None


def _sanitize(name: str) -> str:
    return re.sub(r"[^0-9a-zA-Z_]", "_", name)


def _user_names(mod, args, kwargs, leaves_spec) -> list[str]:
    """A readable name per flattened user input: the forward argument's name, with a suffix for
    positions inside a container (``x``, ``inputs_0``, ``mask``)."""
    try:
        params = list(inspect.signature(mod.forward).parameters)
    except (TypeError, ValueError):
        params = []
    names = []
    for i, a in enumerate(args):
        base = params[i] if i < len(params) and params[i] not in ("args", "kwargs") else f"arg{i}"
        n = len(pytree.tree_leaves(a))
        names += [base] if n == 1 and isinstance(a, torch.Tensor) else [f"{base}_{k}" for k in range(n)]
    for k, v in kwargs.items():
        n = len(pytree.tree_leaves(v))
        names += [k] if n == 1 and isinstance(v, torch.Tensor) else [f"{k}_{j}" for j in range(n)]
    return [_sanitize(n) for n in names]


def _program_inputs(mod, cap: Capture, user_names: list[str]) -> tuple[list[_Input], list[int]]:
    """The program's inputs in torch.export order, and for each captured placeholder its position."""
    inputs: list[_Input] = []
    by_id: dict[int, int] = {}
    for fqn, p in mod.named_parameters():
        by_id.setdefault(id(p), len(inputs))
        inputs.append(_Input(InputKind.PARAMETER, "p_" + _sanitize(fqn), p, fqn))
    non_persistent = {f"{m}.{b}" if m else b for m, sub in mod.named_modules()
                      for b in getattr(sub, "_non_persistent_buffers_set", ())}
    for fqn, b in mod.named_buffers():
        by_id.setdefault(id(b), len(inputs))
        inputs.append(_Input(InputKind.BUFFER, "b_" + _sanitize(fqn), b, fqn, persistent=fqn not in non_persistent))
    user = []
    for leaf, name in zip(cap.user_leaves, user_names):
        if isinstance(leaf, torch.Tensor):
            by_id.setdefault(id(leaf), -1 - len(user))  # resolved below, after the constants
        user.append(_Input(InputKind.USER_INPUT, name, leaf))
    n_const = 0
    positions = []
    for value in cap.example_inputs:
        pos = by_id.get(id(value))
        if pos is None:
            if not isinstance(value, torch.Tensor):
                raise ExportError(f"ember.export: the captured graph takes a non-tensor input {value!r} "
                                  "(an int traced as a symbol); pass it as a tensor or keep it constant")
            # a tensor the forward reads that is neither state nor input (a global, a plain attribute)
            pos = len(inputs)
            target = f"lifted_tensor_{n_const}"
            n_const += 1
            inputs.append(_Input(InputKind.CONSTANT_TENSOR, "c_" + target, value, target))
            by_id[id(value)] = pos
        positions.append(pos)
    base = len(inputs)
    inputs += user
    return inputs, [p if p >= 0 else base + (-1 - p) for p in positions]


def _fake_inputs(inputs: list[_Input], positions: list[int], cap: Capture, fake_mode, templates) -> None:
    template_at = {pos: templates[i] for i, pos in enumerate(positions)} if templates else {}
    for k, inp in enumerate(inputs):
        v = inp.value
        if not isinstance(v, torch.Tensor):
            inp.fake = v
        elif k in template_at and isinstance(template_at[k], torch.Tensor):
            t = template_at[k]
            with fake_mode:
                inp.fake = torch.empty_strided(t.shape, t.stride(), dtype=v.dtype, device=v.device)
        else:
            inp.fake = fake_mode.from_tensor(v.detach(), static_shapes=True)


def _output_plan(cap: Capture, inputs: list[_Input]) -> tuple[list, pytree.TreeSpec]:
    """For each flattened user output: ("graph", k) for the k-th graph output, ("input", j) for a
    program input returned as it is, or ("const", value)."""
    leaves, out_spec = pytree.tree_flatten(cap.output)
    by_out = {id(t): k for k, t in enumerate(cap.graph_outputs) if isinstance(t, torch.Tensor)}
    by_in = {id(inp.value): j for j, inp in enumerate(inputs) if isinstance(inp.value, torch.Tensor)}
    plan = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            if id(leaf) in by_out:
                plan.append(("graph", by_out[id(leaf)]))
            elif id(leaf) in by_in:
                plan.append(("input", by_in[id(leaf)]))
            else:
                raise ExportError(f"ember.export: output leaf {i} is a tensor the captured graph did not produce "
                                  "(an ember bug, or a tensor made outside the traced code)")
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            plan.append(("const", leaf))
        else:
            raise ExportError(f"ember.export: output leaf {i} is a {type(leaf).__name__}; exported programs "
                              "return tensors, ints, floats, bools, strings or None")
    return plan, out_spec


def _module_path(source: str) -> str:
    """The FQN of a module from the frontend's source name: ``self.blocks[0].attn`` -> ``blocks.0.attn``
    (a module not reached from the root keeps its source name)."""
    path = re.sub(r"\[['\"]?([^\]'\"]*)['\"]?\]", r".\1", source)
    if path == "self":
        return ""
    return path[len("self."):] if path.startswith("self.") else path


def _torch_export_meta(gm: fx.GraphModule) -> None:
    """``nn_module_stack`` and ``source_fn_stack`` on the captured graph's nodes, in torch.export's
    form, from the module calls the frontend recorded (``ember_module_calls``, outermost first):
    {"L__self__<fqn>": (fqn, "module.Class")} and [(node name, the function or method called)].
    ``make_fx`` copies both onto the ATen nodes each node becomes (``preserve_node_meta``)."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        stack = {}
        for call in node.meta.get("ember_module_calls", ()):
            path = _module_path(call[2])
            stack["L__self__" + path] = (path, call[3] if len(call) > 3 else call[1])
        if stack:
            node.meta["nn_module_stack"] = stack
        node.meta["source_fn_stack"] = [(node.name, node.target)]


def _trace_aten(cap: Capture, inputs: list[_Input], positions: list[int], plan: list, fake_mode, templates):
    """Functional ATen graph: (all program inputs) -> (new values of mutated inputs..., user outputs...)."""
    mutated: list[int] = []
    interp_gm = cap.gm
    _torch_export_meta(interp_gm)

    def program(*prims):
        with functionalize():
            f_prims = [to_fun(p) for p in prims]
            outs = fx.Interpreter(interp_gm).run(*[f_prims[p] for p in positions])
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            user = []
            for how, what in plan:
                user.append(outs[what] if how == "graph" else f_prims[what] if how == "input" else what)
            mutated[:] = [k for k, (f, p) in enumerate(zip(f_prims, prims))
                          if isinstance(p, torch.Tensor) and mutation_of(f, p).data]
            for k in mutated:
                if mutation_of(f_prims[k], prims[k]).metadata:
                    raise ExportError(f"ember.export: {inputs[k].name} has its sizes/strides changed in place "
                                      "(t_, resize_, set_); exported programs cannot express that")
            return [from_fun(f_prims[k]) for k in mutated] + [from_fun(u) for u in user]

    with fx.traceback.preserve_node_meta(), fake_mode, symbolic_dispatch(templates), torch.no_grad():
        traced = make_fx(program, pre_dispatch=False)(*[inp.fake for inp in inputs])
    return traced, mutated


def _lift_constants(gm: fx.GraphModule, fake_mode, first_user: fx.Node | None, n_existing: int):
    """``get_attr`` tensors (constants created in forward) become CONSTANT_TENSOR placeholders."""
    lifted = []
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        target = f"lifted_tensor_{n_existing + len(lifted)}"
        insert = gm.graph.inserting_before(first_user) if first_user is not None else gm.graph.inserting_before(
            next(n for n in gm.graph.nodes if n.op != "placeholder"))
        with insert:
            ph = gm.graph.placeholder("c_" + target)
        ph.meta.update(node.meta)
        ph.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        node.replace_all_uses_with(ph)
        gm.graph.erase_node(node)
        delattr(gm, node.target)
        lifted.append((ph, target, value))
    return lifted


def _range_constraints(gm: fx.GraphModule, shape_env) -> dict:
    """{size symbol: ValueRanges} for every symbol in the placeholders' sizes."""
    out = {}
    for node in gm.graph.nodes:
        if node.op != "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        for s in node.meta["val"].shape:
            if isinstance(s, torch.SymInt):
                for sym in s.node.expr.free_symbols:
                    if shape_env is not None and sym in shape_env.var_to_range:
                        r = shape_env.var_to_range[sym]
                        out[sym] = ValueRanges(r.lower, r.upper)
    return out


def build_program(mod: torch.nn.Module, cap: Capture, args: tuple, kwargs: dict) -> ExportedProgram:
    user_names = _user_names(mod, args, kwargs, cap.in_spec)
    inputs, positions = _program_inputs(mod, cap, user_names)
    symbolic = symbolic_templates(cap.gm)
    if symbolic is not None:
        fake_mode, templates = symbolic
        fake_mode.allow_non_fake_inputs = True
    else:
        fake_mode, templates = FakeTensorMode(allow_non_fake_inputs=True), None
    _fake_inputs(inputs, positions, cap, fake_mode, templates)
    plan, out_spec = _output_plan(cap, inputs)
    gm, mutated = _trace_aten(cap, inputs, positions, plan, fake_mode, templates)

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, inp in zip(placeholders, inputs):
        node.name = node.target = inp.name
        if not isinstance(inp.value, torch.Tensor):
            node.meta["val"] = inp.value
    first_user = next((n for n, inp in zip(placeholders, inputs) if inp.kind is InputKind.USER_INPUT), None)
    n_consts = sum(inp.kind is InputKind.CONSTANT_TENSOR for inp in inputs)
    lifted = _lift_constants(gm, fake_mode, first_user, n_consts)
    for node in gm.graph.nodes:  # the frontend's "file:line in fn", in the traceback form torch prints
        m = re.match(r"^(.*):(\d+) in (\S+)$", node.meta.get("stack_trace") or "")
        if m:
            node.meta["stack_trace"] = f'  File "{m.group(1)}", line {m.group(2)}, in {m.group(3)}\n'
    gm.graph.eliminate_dead_code()
    gm.recompile()

    # ---- signature
    in_specs, constants, state_dict = [], {}, {}
    user_start = next((k for k, inp in enumerate(inputs) if inp.kind is InputKind.USER_INPUT), len(inputs))
    ordered = [(inp, node) for inp, node in zip(inputs[:user_start], placeholders[:user_start])]
    ordered += [(_Input(InputKind.CONSTANT_TENSOR, ph.name, value, target), ph) for ph, target, value in lifted]
    ordered += [(inp, node) for inp, node in zip(inputs[user_start:], placeholders[user_start:])]
    for inp, node in ordered:
        if inp.kind is InputKind.USER_INPUT and not isinstance(inp.value, torch.Tensor):
            arg = ConstantArgument(name=node.name, value=inp.value)
        else:
            arg = TensorArgument(name=node.name)
        in_specs.append(InputSpec(kind=inp.kind, arg=arg, target=inp.target, persistent=inp.persistent))
        if inp.kind is InputKind.PARAMETER:
            state_dict[inp.target] = inp.value
        elif inp.kind is InputKind.BUFFER:
            (state_dict if inp.persistent else constants)[inp.target] = inp.value
        elif inp.kind is InputKind.CONSTANT_TENSOR:
            constants[inp.target] = inp.value

    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = list(output.args[0])
    out_specs = []
    for k, res in zip(mutated, results):
        inp = inputs[k]
        kind = {InputKind.BUFFER: OutputKind.BUFFER_MUTATION, InputKind.PARAMETER: OutputKind.PARAMETER_MUTATION,
                InputKind.USER_INPUT: OutputKind.USER_INPUT_MUTATION}.get(inp.kind)
        if kind is None:
            raise ExportError(f"ember.export: the forward mutates {inp.name}, a tensor that is not a parameter, "
                              "buffer or input (e.g. a global tensor); make it a registered buffer")
        target = inp.name if kind is OutputKind.USER_INPUT_MUTATION else inp.target
        out_specs.append(OutputSpec(kind=kind, arg=TensorArgument(name=res.name), target=target))
    for res in results[len(mutated):]:
        arg = TensorArgument(name=res.name) if isinstance(res, fx.Node) else ConstantArgument(name="", value=res)
        out_specs.append(OutputSpec(kind=OutputKind.USER_OUTPUT, arg=arg, target=None))
    signature = ExportGraphSignature(input_specs=in_specs, output_specs=out_specs)

    shape_env = getattr(fake_mode, "shape_env", None)
    # the arguments this call passed, by name: ep.module() takes exactly those
    forward_names = list(inspect.signature(mod.forward).bind(*args, **kwargs).arguments)
    entry = ModuleCallEntry(fqn="", signature=ModuleCallSignature(
        inputs=[], outputs=[], in_spec=cap.in_spec, out_spec=out_spec, forward_arg_names=forward_names))
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature, state_dict=state_dict,
        range_constraints=_range_constraints(gm, shape_env), module_call_graph=[entry],
        example_inputs=(tuple(args), dict(kwargs)), constants=constants)
