"""Which nodes of an ATen graph may run in OpenVINO.

There is no hand-written allow-list of the ops OpenVINO converts: that list lives in OpenVINO's C++
frontend, changes with every release, and a copy would drift. Instead a node is offered to OpenVINO
unless a rule below says no, and the converter itself is the judge: the ops it reports as
unconvertible are remembered (``reject``) for the rest of the process and the graph is partitioned
again without them. The rules here cover what conversion would accept but get wrong:

* random ops: OpenVINO has its own generator, so a seeded eager run would draw other numbers;
* dtypes OpenVINO's CPU plugin does not compute as PyTorch does (float64 runs in float32 there,
  complex does not exist) or that cannot cross the boundary without a copy (bfloat16 has no numpy type);
* values that are not tensors (``.item()`` results), and empty tensors. Under dynamic shapes, size
  arithmetic (``aten.sym_size``, ``operator.mul`` on sizes) runs in Python too, and a partition
  that needs a size takes it as an int input;
* ``KNOWN_MISMATCHES``: ops that convert but differ from eager, found by tests/openvino's op table;
* the user's ``disabled_ops``.

Multi-output ops whose converter yields only their first outputs (``native_layer_norm``'s mean and
rstd, the CPU flash attention's logsumexp: inference never reads them, training saves them for the
backward) are learnt the same way, from the converter's "index out of bounds" error on the
``getitem``: a node that reads a later output stays in PyTorch, the others still convert.
"""
from __future__ import annotations

import operator
import re

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.passes.operator_support import OperatorSupportBase

from ember.backends.openvino.options import OVOptions

# Tensor dtypes a partition may consume or produce.
OV_DTYPES = {torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
             torch.bool}

# Ops worth a partition of their own: each does enough work to pay for the call into OpenVINO (tens of
# microseconds). Smaller ops between two PyTorch ops stay in PyTorch (the partitioner's single-node rule).
HEAVY_OPS = {f"torch.ops.aten.{name}" for name in (
    "convolution.default", "mm.default", "bmm.default", "addmm.default", "baddbmm.default",
    "_scaled_dot_product_flash_attention_for_cpu.default", "native_layer_norm.default",
    "native_group_norm.default", "max_pool2d_with_indices.default", "avg_pool2d.default",
    "_adaptive_avg_pool2d.default", "upsample_bilinear2d.vec", "upsample_nearest2d.vec",
    "embedding.default", "_softmax.default", "_log_softmax.default",
)}

# Ops that move no data: a partition made only of these is not worth converting.
NON_COMPUTE_OPS = {"_operator.getitem"} | {f"torch.ops.aten.{name}" for name in (
    "view.default", "_unsafe_view.default", "reshape.default", "permute.default", "t.default",
    "transpose.int", "expand.default", "squeeze.dim", "squeeze.dims", "unsqueeze.default", "slice.Tensor",
    "select.int", "alias.default", "clone.default", "detach.default", "lift_fresh_copy.default",
)}


# Predicates of KNOWN_MISMATCHES: does this node hit the problem?
def _always(node) -> bool:
    return True


def _integer_inputs(node) -> bool:
    return any(isinstance(a, fx.Node) and _is_int(a.meta.get("val")) for a in node.args)


def _negative_start(node) -> bool:
    return len(node.args) > 1 and isinstance(node.args[0], (int, float)) and node.args[0] < 0


def _is_int(value) -> bool:
    return isinstance(value, torch.Tensor) and not value.dtype.is_floating_point and value.dtype != torch.bool


# Ops that convert but do not match eager in some uses, found by tests/openvino's op table:
# op name -> (does this node hit the problem?, why it stays in PyTorch).
KNOWN_MISMATCHES = {
    "aten.div.Tensor_mode": (_integer_inputs, "integer floor division rounds towards zero in OpenVINO"),
    "aten.floor_divide.default": (_integer_inputs, "integer floor division rounds towards zero in OpenVINO"),
    # abs(arange(-n, m)) folds to wrong constants (reflection padding's index math hits it)
    "aten.arange.start_step": (_negative_start, "OpenVINO folds ops on a range starting below zero wrongly"),
    "aten.arange.start": (_negative_start, "OpenVINO folds ops on a range starting below zero wrongly"),
    # eager returns uninitialised memory: any result is right, but outputs could not be compared
    "aten.empty.memory_format": (_always, "uninitialised memory in eager"),
    "aten.empty_strided.default": (_always, "uninitialised memory in eager"),
    "aten.empty_like.default": (_always, "uninitialised memory in eager"),
}

# 8-bit integer arithmetic saturates in OpenVINO where PyTorch wraps around; only moving such values
# (views, concatenation) and the quantize/dequantize ops of quantized models are offloaded.
SMALL_INTS = {torch.int8, torch.uint8}
SMALL_INT_OPS = {"aten.cat.default", "aten.clone.default"}


# Targets that never run in OpenVINO whatever their dtypes: they produce host values, assert, or print.
_HOST_OPS = {"aten._local_scalar_dense.default", "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
             "aten._assert_async.msg", "aten._assert_scalar.default", "aten._print.default",
             "aten.sym_constrain_range_for_size.default", "aten._assert_tensor_metadata.default"}

SIZE_ARITHMETIC = "size arithmetic: runs in Python, partitions take its result as an int input"

# Op names the converter refused in this process (str(target), e.g. "aten._fft_r2c.default").
_rejected: set[str] = set()


# Multi-output ops the converter gives fewer outputs than PyTorch: op name -> how many it gives.
_output_limits: dict[str, int] = {}


def reject(names) -> None:
    _rejected.update(names)


def limit_outputs(limits: dict[str, int]) -> None:
    for name, n in limits.items():
        _output_limits[name] = min(n, _output_limits.get(name, n))


def rejected() -> frozenset:
    return frozenset(_rejected)


_FAILURE_LISTS = re.compile(r"(?:No conversion rule found for operations|Conversion is failed for):\s*([^\n]+)")
# "conversion of operation getitem_1/<built-in function getitem> ... Index: 1 is out of bounds of
# input list of len: 1": the producer of getitem_1 converted to fewer outputs than it has
_SHORT_OUTPUTS = re.compile(r"conversion of operation (\w+)/<built-in function getitem>"
                            r"(?:(?!conversion of operation).)*?out of bounds of input list of len: (\d+)", re.S)
# what the converter reports besides the real culprit when a getitem fails (an internal list type)
CONVERTER_INTERNALS = {"<built-in function getitem>", "SequenceMark"}


def unconvertible_ops(message: str) -> set[str]:
    """Op names an OpenVINO conversion error blames (its summary lines), or an empty set."""
    names: set[str] = set()
    for match in _FAILURE_LISTS.finditer(message):
        names.update(n.strip() for n in match.group(1).split(",") if n.strip())
    return names


def short_outputs(message: str, gm: fx.GraphModule) -> dict[str, int]:
    """{op name: outputs the converter gave} for the multi-output nodes of ``gm`` whose getitem an
    OpenVINO conversion error says reached past the converted outputs."""
    nodes = {n.name: n for n in gm.graph.nodes}
    limits: dict[str, int] = {}
    for name, length in _SHORT_OUTPUTS.findall(message):
        node = nodes.get(name)
        if node is not None and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            op = str(node.args[0].target)
            limits[op] = min(int(length), limits.get(op, int(length)))
    return limits


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def is_symbolic(value) -> bool:
    """A SymInt/SymFloat/SymBool, or a tensor with a symbolic size (dynamic shapes)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    return isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape)


def is_size_arithmetic(node: fx.Node) -> bool:
    """A node computing a symbolic scalar (``aten.sym_size``, ``operator.mul`` on sizes...): it runs in
    Python between partitions, and a partition that needs the result takes it as an int input."""
    return node.op == "call_function" and isinstance(node.meta.get("val"),
                                                     (torch.SymInt, torch.SymFloat, torch.SymBool))


def _int_input(value) -> bool:
    """An int a partition can take as a 0-d int64 input (a size, under dynamic shapes)."""
    return isinstance(value, torch.SymInt)


def _maybe_empty(value: torch.Tensor) -> bool:
    numel = value.numel()
    if isinstance(numel, torch.SymInt):
        # symbolic sizes are >= 2: known non-zero without adding a guard (bool() would add one)
        return not statically_known_true(numel != 0)
    return numel == 0


def _value_problem(value, in_tuple: bool = False) -> str | None:
    """Why a node result cannot cross a partition boundary, or None. Results must be non-empty CPU
    tensors (or tuples of them) of a dtype in OV_DTYPES. Inside a tuple an empty tensor is fine (batch
    norm's unused statistics): only what a getitem takes out crosses a boundary."""
    if isinstance(value, (list, tuple)):
        if not value:
            return "an empty tuple"
        return next((p for p in (_value_problem(v, True) for v in value if v is not None) if p), None)
    if not isinstance(value, torch.Tensor):
        return f"a {type(value).__name__}, not a tensor"
    if value.dtype not in OV_DTYPES:
        return f"{value.dtype} (OpenVINO's CPU plugin does not compute it as PyTorch does)"
    if value.device.type != "cpu":
        return f"on {value.device}"
    if not in_tuple and _maybe_empty(value):
        return "an empty tensor"
    return None


def why_not(node: fx.Node, opts: OVOptions) -> str | None:
    """None if ``node`` may go to OpenVINO, else the reason it stays in PyTorch."""
    if node.op != "call_function":
        return "not an op"
    if is_size_arithmetic(node):
        return SIZE_ARITHMETIC
    target = node.target
    if target is operator.getitem:
        problem = _value_problem(node.meta.get("val"))
        return f"takes out {problem}" if problem else None
    if not isinstance(target, torch._ops.OpOverload):
        return f"{getattr(target, '__name__', target)} is not an ATen op"
    name = str(target)  # "aten.relu.default"
    packet = name.rsplit(".", 1)[0]
    if name in opts.disabled_ops or packet in opts.disabled_ops:
        return "disabled by the disabled_ops option"
    if name in _rejected:
        return "OpenVINO's converter has no rule for it"
    limit = _output_limits.get(name)
    if limit is not None and any(u.target is operator.getitem and u.args[1] >= limit for u in node.users):
        return f"OpenVINO converts only its first {limit} output(s) and a later one is used"
    if name in KNOWN_MISMATCHES and KNOWN_MISMATCHES[name][0](node):
        return KNOWN_MISMATCHES[name][1]
    if name in _HOST_OPS or target.namespace not in ("aten", "prims", "quantized_decomposed"):
        return "host-side or non-ATen op"
    if torch.Tag.nondeterministic_seeded in target.tags and not _no_randomness(node):
        return "random: OpenVINO would draw different numbers than PyTorch"
    problem = _value_problem(node.meta.get("val"))
    if problem:
        return f"its result is {problem}"
    for arg in node.all_input_nodes:
        if _int_input(arg.meta.get("val")):
            continue  # becomes an int input of the partition
        problem = _value_problem(arg.meta.get("val"))
        if problem:
            return f"an input is {problem}"
    val = node.meta.get("val")
    if (target.namespace == "aten" and isinstance(val, torch.Tensor) and val.dtype in SMALL_INTS
            and name not in SMALL_INT_OPS and f"torch.ops.{name}" not in NON_COMPUTE_OPS):
        return f"{val.dtype} arithmetic saturates in OpenVINO, wraps around in PyTorch"
    for value in (*node.args, *node.kwargs.values()):
        # a dtype argument (to_copy, full...) that OpenVINO would compute differently
        if isinstance(value, torch.dtype) and value not in OV_DTYPES:
            return f"computes in {value}"
    return None


def _no_randomness(node: fx.Node) -> bool:
    """A seeded op called with a zero dropout probability (attention in eval mode) draws nothing."""
    schema = node.target._schema
    for k, arg in enumerate(schema.arguments):
        if arg.name in ("dropout_p", "p"):
            value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name, arg.default_value)
            return value == 0
    return False


class Support(OperatorSupportBase):
    """The rules above as a torch.fx OperatorSupport, for CapabilityBasedPartitioner."""

    def __init__(self, opts: OVOptions):
        self.opts = opts
        self.reasons: dict[str, str] = {}  # node name -> why it stays in PyTorch (for the log)

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        reason = why_not(node, self.opts)
        if reason is not None and node.op == "call_function":
            self.reasons[node.name] = reason
        return reason is None
