"""Per-op knowledge of the autograd layer, kept as tables: which ops are decomposed while tracing, and
which ones the partitioner may recompute in the backward instead of saving their result.

Rules are keyed by ATen overload packets; tags (``torch.Tag.pointwise``, ``nondeterministic_seeded``)
cover the long tail so that the tables only list what tags do not say.
"""
from __future__ import annotations

import functools
import operator

import torch

from ember.aot.lazy_table import ABSENT, LazyTable, core_aten_lookup, core_aten_lookup_supported

aten = torch.ops.aten

# ------------------------------------------------------------------------------------------ decompositions


def core_aten_table() -> LazyTable:
    """``torch._decomp.core_aten_decompositions()``, whose transposes take ``FAST_VIEW_DECOMPOSITIONS``
    (the same graph, fewer dispatches), as a ``LazyTable``: building it takes 0.1-0.35 s (torch lists
    every CompositeImplicitAutograd op), so single ops are answered without it; the native backend's
    table starts from it too."""
    return _CORE_ATEN


def _build_core_aten() -> dict:
    from torch._decomp import core_aten_decompositions
    return {**core_aten_decompositions(), **FAST_VIEW_DECOMPOSITIONS}


def _core_aten_lookup(op):
    fn = FAST_VIEW_DECOMPOSITIONS.get(op, ABSENT)
    return core_aten_lookup(op) if fn is ABSENT else fn


def _build_core() -> dict:
    # Random ops stay as they are: eager runs e.g. aten.bernoulli / aten.native_dropout, and a
    # decomposition into rand + compare would draw a different random stream for the same seed.
    # (This drops sdpa and the fused RNNs too: they are tagged seeded for their dropout argument.)
    return {op: fn for op, fn in _CORE_ATEN.items() if not is_random_op(op)}


def _core_lookup(op):
    return ABSENT if is_random_op(op) else _CORE_ATEN.resolve(op)


# Decompositions that give the graph torch's references give (``torch._refs.transpose`` / ``t``: an
# ``aten.permute`` node, or ``aten.alias`` where nothing moves) in one dispatch. The references run
# through their Python wrappers, and ``t`` calls ``torch.transpose``, which dispatches again and is
# decomposed in turn before its ``torch.permute`` dispatches a third time, each pass through the
# tracer's torch-function and dispatch modes: ~1,900 transposes of a 24-layer Llama's joint trace
# took ~12% of it. (``tests/aot/test_view_decompositions.py`` compares the graphs.)

def _transpose(a, dim0: int, dim1: int):
    from torch._prims_common import canonicalize_dims
    d0, d1 = canonicalize_dims(a.dim(), (dim0, dim1))
    if a.dim() <= 1 or dim0 == dim1:  # (as the reference: the dims as given, not canonicalized)
        return aten.alias.default(a)
    perm = list(range(a.dim()))
    perm[d0], perm[d1] = d1, d0
    return aten.permute.default(a, perm)


def _t(a):
    if a.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {a.dim()}D")
    return aten.alias.default(a) if a.dim() < 2 else aten.permute.default(a, [1, 0])


FAST_VIEW_DECOMPOSITIONS = {aten.transpose.int: _transpose, aten.t.default: _t}
_CORE_ATEN = LazyTable("core_aten", _build_core_aten, _core_aten_lookup if core_aten_lookup_supported() else None)
_CORE = LazyTable("aot.core", _build_core, _core_lookup)


def default_decompositions() -> dict:
    """The table traced graphs are lowered with: core ATen, minus every random op."""
    return dict(_CORE)


def decomposition_table(extra: dict | None) -> dict:
    """``default_decompositions()`` extended (and overridden) by ``extra``, an op -> function mapping;
    an op mapped to None is taken out (a backend that lowers the op itself keeps it whole).

    For no ``extra``, or ember's own lazy table, the result is a ``LazyTable`` too: ops are answered
    one by one as the tracer asks (``make_fx_lazy``), and a process whose graphs all come from the
    caches asks about none."""
    if extra is None or isinstance(extra, LazyTable):
        name = "aot.default" + (f"+{extra.ember_key}" if extra is not None else "")
        return LazyTable(name, lambda: _merged(extra), functools.partial(_merged_lookup, extra))
    return _merged(extra)


def _merged(extra) -> dict:
    table = default_decompositions()
    if extra:
        table.update(extra)
    return {op: fn for op, fn in table.items() if fn is not None}


def _merged_lookup(extra, op):
    if extra is not None:
        fn = extra.resolve(op)
        if fn is not ABSENT:
            return ABSENT if fn is None else fn
    return _CORE.resolve(op)


# ------------------------------------------------------------------------ torch-level rewrites while tracing

def _sdpa_with_unit_stride_mask(query, key, value, attn_mask=None, *args, **kwargs):
    """scaled_dot_product_attention given a materialized copy of a broadcast mask (last-dim stride 0)
    on GPUs.

    Hugging Face models build an all-true padding mask and expand it when they see a compiler
    (eagerly they pass no mask). GPU attention kernels need the mask's last dim at stride 1, so
    SDPA falls back to its math path: two batched matmuls in fp32 and a softmax, 2-3x slower than
    the fused kernel for BERT-base. The values are the same; only the layout changes."""
    if (isinstance(attn_mask, torch.Tensor) and attn_mask.device.type != "cpu" and attn_mask.dim() > 0
            and attn_mask.stride(-1) == 0 and attn_mask.size(-1) > 1):
        attn_mask = attn_mask.contiguous()
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, *args, **kwargs)


# torch function -> replacement with the same result, applied to the captured graph as it is traced
TORCH_REWRITES = {torch.nn.functional.scaled_dot_product_attention: _sdpa_with_unit_stride_mask}


class TraceRewrites(torch.overrides.TorchFunctionMode):
    """Applies ``TORCH_REWRITES`` while the autograd layer traces a captured graph (the mode is off
    inside a rewrite, so a rewrite calls the original function)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return TORCH_REWRITES.get(func, func)(*args, **(kwargs or {}))


# ------------------------------------------------------------------------------------------- op classes

def _packet(op):
    return getattr(op, "overloadpacket", op)


def is_random_op(op) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def _packets(names: str) -> set:
    """ATen overload packets by name; names this torch build lacks are skipped (the tables hold ops
    of several torch versions and devices)."""
    return {p for p in (getattr(aten, n, None) for n in names.split()) if p is not None}


# Views and reshapes: free to recompute (no data moves) and, under functionalization, never aliased
# with something a later op mutates.
VIEW_OPS = _packets("""
    view _unsafe_view reshape permute t transpose expand squeeze unsqueeze slice select alias as_strided
    split split_with_sizes unbind diagonal narrow view_as_real view_as_complex unfold detach lift_fresh
""")

# Cheap non-pointwise ops: tensor factories, copies and dtype casts, shape-only work. Recomputing them
# in the backward costs a memory pass at most, and saves storing their (often large) result.
CHEAP_OPS = _packets("""
    clone _to_copy full full_like zeros zeros_like ones ones_like empty empty_like empty_strided
    empty_permuted scalar_tensor arange fill copy cat constant_pad_nd index gather embedding slice_scatter
    select_scatter scatter squeeze_copy unsqueeze_copy view_copy permute_copy expand_copy t_copy transpose_copy
    lift_fresh_copy
""")

# Reductions and normalizations: one pass over an input that is usually kept anyway. The min cut
# recomputes them only when that saves memory, e.g. a softmax's output is rebuilt from its input and
# statistics. A reduction whose result is much smaller than its input (a row max, a sum of exps, a
# layer norm's mean) is never recomputed: saving it costs almost nothing, while the cut, which counts
# bytes only, would redo a whole pass over the input (GPT-2's loss: two extra passes over the logits).
REDUCTION_OPS = _packets("""
    sum mean amax amin var var_mean std prod any all argmax argmin max min _softmax _log_softmax
    _safe_softmax native_layer_norm native_group_norm cumsum
""")

# Ops that always stay in the forward and are saved if the backward needs them, whatever their size.
# Random ops: a recomputation would draw new numbers. Compute-bound ops (matmul, conv, attention) cost
# far more to redo than to keep. Anything not listed in VIEW_OPS/CHEAP_OPS/REDUCTION_OPS and not
# pointwise is also treated this way; this table only documents the deliberate cases.
NEVER_RECOMPUTE = {op: why for names, why in (
    ("mm bmm addmm baddbmm convolution _convolution", "compute-bound: cheaper to keep than to redo"),
    ("_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_efficient_attention "
     "_scaled_dot_product_flash_attention _scaled_dot_product_cudnn_attention", "compute-bound attention kernel"),
    ("native_dropout bernoulli rand rand_like randn randn_like randint randint_like randperm normal uniform "
     "multinomial", "random: recomputing would draw different numbers"),
) for op in _packets(names)}


SMALL_RESULT_RATIO = 4  # a reduction whose inputs are this many times larger than its results is kept


def _tensor_bytes(values) -> int:
    """Bytes of the tensors in ``values`` (symbolic sizes at their hint, as the partitioner counts)."""
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            n = v.numel()
            if not isinstance(n, int):
                n = n.node.hint if isinstance(n.node.hint, int) else 0
            total += n * v.element_size()
        elif isinstance(v, (tuple, list)):
            total += _tensor_bytes(v)
    return total


def _shrinks(node) -> bool:
    """A node reducing its inputs to results at least SMALL_RESULT_RATIO times smaller."""
    out = _tensor_bytes([node.meta.get("val")])
    ins = _tensor_bytes([a.meta.get("val") for a in node.all_input_nodes])
    return 0 < out * SMALL_RESULT_RATIO <= ins


# Ops a backend runs as library calls (cuBLAS, cuDNN), not fused with what produces their operands:
# an operand recomputed for them in the backward is a kernel of its own.
LIBRARY_OPS = _packets("""
    mm bmm addmm baddbmm convolution _convolution convolution_backward _scaled_dot_product_flash_attention
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
    _scaled_dot_product_flash_attention_backward _scaled_dot_product_efficient_attention_backward
    _scaled_dot_product_cudnn_attention_backward
""")


def _cast_of_inputs_for_a_library_op(node, backward: set) -> bool:
    """A cast of graph inputs only (autocast's bf16 copy of a weight) that a matmul or convolution of
    the backward reads. The min cut, counting bytes, would always recompute it (its input is alive
    anyway), adding one copy kernel per weight to the backward (53 per ResNet-50 step, 48 per GPT-2
    step); eager autograd keeps the cast copy instead, and so does this rule."""
    if _packet(node.target) is not aten._to_copy or not node.all_input_nodes:
        return False
    if not all(a.op == "placeholder" for a in node.all_input_nodes):
        return False
    return any(u in backward and _packet(u.target) in LIBRARY_OPS for u in node.users)


def recompute_rule(target, node=None, backward: set | None = None) -> tuple[bool, str]:
    """(may the backward recompute this op?, why) for a call_function target of an ATen graph
    (``node``, when given, lets the rule look at sizes, and ``backward``, the backward's nodes, at
    the node's users there)."""
    if is_random_op(target):
        return False, "random: recomputing would draw different numbers"
    if node is not None and backward and _cast_of_inputs_for_a_library_op(node, backward):
        return False, "cast of an input read by a matmul/convolution of the backward: kept, as eager keeps it"
    packet = _packet(target)
    if packet in NEVER_RECOMPUTE:
        return False, NEVER_RECOMPUTE[packet]
    if packet in VIEW_OPS:
        return True, "view"
    if torch.Tag.pointwise in getattr(target, "tags", ()):
        return True, "pointwise"
    if packet in CHEAP_OPS:
        return True, "cheap copy/factory"
    if packet in REDUCTION_OPS:
        if node is not None and _shrinks(node):
            return False, "reduction to a much smaller result: cheaper to keep than to re-read its input"
        return True, "reduction/normalization"
    if target is operator.getitem:
        return True, "tuple element"
    name = getattr(packet, "__name__", str(target))
    return False, f"{name} is not in the recompute tables (unknown ops are kept)"

