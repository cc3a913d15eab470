"""Attention masks the graph builds from sizes alone, replaced by what they mean.

Hugging Face models pass no mask to ``scaled_dot_product_attention`` when they run eagerly (a causal
model sets ``is_causal=True``, an encoder without padding passes nothing), but when they see a
compiler (``torch.compiler.is_compiling()``) they build the mask out of ``arange`` and comparisons
and pass it, so that an exported graph stays right for other inputs (transformers'
``_ignore_causal_mask_sdpa``). With a mask, the attention kernels do the whole L x S product and
read the mask: GPT-2's attention took 0.425 ms per step against eager's 0.225 ms on an H100, with
the same cuDNN kernel.

In a captured graph with static shapes such a mask depends on no input: its value is fixed when the
graph is compiled. This pass evaluates the mask's subgraph (pure, allow-listed ops only; real
tensors; no input, no parameter, no random op) and, when the value is exactly

* all allowed (a bool mask of True, a float mask of 0): the mask is dropped;
* the upper-left causal pattern that ``is_causal=True`` means (``tril`` of L x S), broadcast over
  the batch and heads: the mask is dropped and ``is_causal=True`` set,

so the attention computes exactly what it computed with the mask. Anything else, a mask that depends
on an input, or a size symbol (dynamic shapes), is left alone. The mask's nodes that nothing else
uses are removed.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

STATS = {"dropped": 0, "causal": 0}

_SDPA = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}

# ops a size-only mask is built from: pure and deterministic (by name: torch functions, Tensor
# methods and operators share them)
_PURE = {
    "arange", "full", "ones", "zeros", "tensor", "scalar_tensor", "tril", "triu", "where", "masked_fill",
    "expand", "expand_as", "unsqueeze", "squeeze", "view", "reshape", "permute", "transpose", "contiguous",
    "clone", "repeat", "to", "bool", "float", "int", "long", "type_as", "flip",
    "add", "sub", "mul", "neg", "le", "lt", "ge", "gt", "eq", "ne", "and_", "or_", "xor", "invert",
    "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "getitem",
    "floordiv", "mod", "remainder", "abs", "minimum", "maximum", "min", "max", "any", "all", "cat", "stack",
    "__and__", "__or__", "__invert__", "__getitem__",
}
_MAX_NUMEL = 1 << 26  # (a mask larger than this is left alone: evaluating it costs memory at compile)


def _name(node: fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", "")


def _mask_nodes(mask: fx.Node):
    """The nodes the mask is computed from (topological order), or None when one of them is an
    input, a parameter, or not an allow-listed pure op."""
    seen, order, stack = set(), [], [mask]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        name = _name(n)
        if n.op not in ("call_function", "call_method") or name not in _PURE:
            return None
        if n.op == "call_function" and not any(n.target is getattr(ns, name, None)
                                               for ns in (operator, torch, torch.Tensor, torch.nn.functional)):
            return None  # (a user function that happens to share a name)
        seen.add(n)
        stack.extend(n.all_input_nodes)
    for n in mask.graph.nodes:  # (graph order is a topological order)
        if n in seen:
            order.append(n)
    return order


def _evaluate(nodes: list):
    env: dict = {}
    for n in nodes:
        args = fx.node.map_arg(n.args, env.__getitem__)
        kwargs = fx.node.map_arg(n.kwargs, env.__getitem__)
        if n.op == "call_method":
            env[n] = getattr(args[0], n.target)(*args[1:], **kwargs)
        else:
            env[n] = n.target(*args, **kwargs)
        v = env[n]
        if isinstance(v, torch.Tensor) and (v.numel() > _MAX_NUMEL or v.requires_grad):
            raise ValueError("not a small constant mask")
    return env[nodes[-1]]


def _meaning(mask: torch.Tensor, L: int, S: int) -> str | None:
    """"none" (nothing masked), "causal" (is_causal=True's mask) or None, for a mask of SDPA's
    query length L and key length S."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or mask.is_complex():
        return None
    try:
        full = torch.broadcast_to(mask, mask.shape[:-2] + (L, S))
    except RuntimeError:
        return None
    if mask.dtype == torch.bool:
        allowed = full
    elif mask.is_floating_point():
        # an allowed position adds 0; a masked one must be -inf, or the dtype's lowest value, which
        # softmax turns into the same exact 0 (exp underflows) in every row that keeps a position
        low = torch.finfo(mask.dtype).min
        allowed = full == 0
        if not bool(((full == 0) | (full == float("-inf")) | (full == low)).all()):
            return None
    else:
        return None
    if bool(allowed.all()):
        return "none"
    causal = torch.ones(L, S, dtype=torch.bool, device=full.device).tril()
    if bool((allowed == causal).all()) and bool(causal.any(-1).all()):
        return "causal"
    return None


def _lengths(node: fx.Node):
    q, k = (node.args + (None, None))[:2]
    qv = q.meta.get("example_value") if isinstance(q, fx.Node) else None
    kv = k.meta.get("example_value") if isinstance(k, fx.Node) else None
    if not isinstance(qv, torch.Tensor) or not isinstance(kv, torch.Tensor):
        return None
    L, S = qv.shape[-2], kv.shape[-2]
    return (L, S) if type(L) is int and type(S) is int else None


def simplify_attention_masks(gm: fx.GraphModule) -> int:
    """Rewrite ``gm``'s SDPA calls whose masks are size-only constants (see the module's docstring);
    returns the number of calls rewritten (``gm`` is recompiled when it is not 0)."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        if len(node.args) > 3 or "attn_mask" not in node.kwargs or node.kwargs.get("is_causal", False):
            continue  # (a positional mask or flag: left alone)
        mask = node.kwargs["attn_mask"]
        sizes = _lengths(node)
        if not isinstance(mask, fx.Node) or sizes is None:
            continue
        nodes = _mask_nodes(mask)
        if not nodes:
            continue
        try:
            with torch.no_grad():
                meaning = _meaning(_evaluate(nodes), *sizes)
        except Exception:  # noqa: BLE001 - anything surprising: the mask stays
            continue
        if meaning is None:
            continue
        kwargs = dict(node.kwargs, attn_mask=None)
        if meaning == "causal":
            kwargs["is_causal"] = True
        node.kwargs = kwargs
        STATS["dropped" if meaning == "none" else "causal"] += 1
        changed += 1
        for n in reversed(nodes):  # the mask's own nodes nothing else reads
            if not n.users:
                gm.graph.erase_node(n)
    if changed:
        gm.recompile()
    return changed
