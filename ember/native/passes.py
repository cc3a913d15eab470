"""FX passes the native backend runs on an ATen graph before lowering it, in order.

Each pass takes ``(gm, opts, on_cpu)``, rewrites ``gm`` in place and returns what it changed (a
count, for logs and tests). ``run`` applies the ones whose option is on.

* ``cse``: common subexpressions. Traced graphs repeat pure ops: every attention layer of a
  Hugging Face encoder expands the same padding mask, and each copy would otherwise be lowered,
  realized and written to memory once per layer (BERT-base: 12 x 25 MB per call).
* ``patchify_conv``: convolutions whose stride is their kernel (a ViT's patch embedding) become one
  matmul on the gathered patches (``patchify.py``); before ``pad_mm``, which may pad that matmul.
* ``pad_mm``: matmuls whose sizes break cuBLAS's alignment (``pad_mm.py``).
* ``sdpa_flash`` (off by default): CUDA inference attention that dispatched to cuDNN runs as
  FlashAttention-2 (``sdpa.py``).
* ``small_mm_flops`` (``fuse_activations``): a ReLU/GELU after a matmul that becomes a ``SmallMM``
  runs in its epilogue (``small_mm.py``).
* ``fusion`` (``fuse_tanh_gelu``): a tanh GELU after a CUDA fp16/bf16 addmm runs in cuBLASLt's
  epilogue (``cuda_mm.py``), where small_mm does not take the matmul; after pad_mm (a padded
  matmul is left alone).
"""
from __future__ import annotations

import operator

import torch

from ember.native import pad_mm, patchify
from ember.native.options import NativeOptions

aten = torch.ops.aten

# ops that are not pure even without a mutable schema: they draw random numbers (flash/efficient
# attention with dropout, fused dropout kernels) or return fresh uninitialized memory
_IMPURE_WORDS = ("dropout", "rand", "philox", "attention", "empty", "seed")


def _pure(target) -> bool:
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    pure = _PURE.get(target)
    if pure is None:  # (per op, not per node: a deep model's graph calls a few dozen ops thousands of times)
        pure = _PURE[target] = not (target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
                                    or any(w in target._schema.name for w in _IMPURE_WORDS))
    return pure


_PURE: dict = {}  # OpOverload -> _pure's answer


def _key(node):
    def norm(a):
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, *map(norm, a))
        if isinstance(a, torch.fx.Node):
            return ("node", a)
        if isinstance(a, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format)):
            return (type(a).__name__, a)
        raise TypeError  # anything else: not worth proving equal
    return (node.target, norm(node.args), norm(tuple(sorted(node.kwargs.items()))))


def _returned(node) -> bool:
    return any(u.op == "output" for u in node.users)


def cse(gm: torch.fx.GraphModule, opts=None, on_cpu=False) -> int:
    seen: dict = {}
    merged = 0
    for node in list(gm.graph.nodes):
        # outputs stay distinct tensors (eager returns two objects; merged they would alias)
        if node.op != "call_function" or not _pure(node.target) or _returned(node):
            continue
        try:
            key = _key(node)
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)
            merged += 1
    if merged:
        gm.recompile()
    return merged


def _patchify(gm, opts, on_cpu) -> int:
    return patchify.rewrite(gm, on_cpu=on_cpu)


def _pad_mm(gm, opts, on_cpu) -> int:
    return pad_mm.pad_matmuls(gm, opts.pad_mm_min_flops, on_cpu=on_cpu, rows=opts.pad_mm_rows)


def _sdpa_flash(gm, opts, on_cpu) -> int:
    from ember.native import sdpa
    return sdpa.cudnn_to_flash(gm, on_cpu=on_cpu)


def _fuse_activations(gm, opts, on_cpu) -> int:
    from ember.native import small_mm  # (imports Triton)
    return small_mm.fuse_activations(gm, opts, on_cpu)


def _fuse_tanh_gelu(gm, opts, on_cpu) -> int:
    from ember.native import cuda_mm
    return cuda_mm.fuse_tanh_gelu(gm, opts.small_mm_flops)


# (option that enables it, pass)
PASSES = [("cse", cse), ("patchify_conv", _patchify), ("pad_mm", _pad_mm), ("sdpa_flash", _sdpa_flash),
          ("fusion", _fuse_tanh_gelu), ("small_mm_flops", _fuse_activations)]


def run(gm: torch.fx.GraphModule, opts: NativeOptions, on_cpu: bool = False) -> dict:
    """Apply the enabled passes in order; returns {pass name: what it changed}."""
    return {name: fn(gm, opts, on_cpu) for name, fn in PASSES if getattr(opts, name)}
