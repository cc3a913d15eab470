"""FX rewrite of CUDA matmuls for the Triton path (``passes.run`` applies it before lowering).

* ``fuse_tanh_gelu``: ``gelu_tanh(addmm(bias, x, w))`` -> ``_addmm_activation(bias, x, w, use_gelu=True)``,
  the GELU computed in cuBLASLt's epilogue (``CUBLASLT_EPILOGUE_GELU_BIAS``).

Why: GPT-2's MLP (HF ``NewGELUActivation``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``)
otherwise runs its GELU as a Triton kernel that reads and writes the whole [b*s, 4d] activation once: on
the H100, GPT-2 124M at b8x512 bf16 inference, 12 launches of 17 us, 0.209 ms of 2.476 ms device time per
call (``benchmarks/kernel_profile.py gpt2_infer ember``). The matmul before it already runs in cuBLASLt
with its bias in the epilogue; the GELU epilogue is the same kernel's last step, on the fp32 accumulator.

Which GELU. On CUDA, ATen's ``_addmm_activation(use_gelu=True)`` is the tanh approximation: the Lt
epilogue implements it, and the fallback (Lt declined or failed: ``addmm_out_cuda_impl`` in
aten/src/ATen/native/cuda/Blas.cpp) runs ``gelu_(result, "tanh")``. On CPU the same op computes the erf
GELU, so this rewrite is CUDA-only (CPU graphs keep ``cpu_mm.fuse_activations``, which maps erf GELU).

Matching. The GELU is recognised by what it computes, not by how it is spelled: the pointwise nodes fed
only by the matmul's result (through the views that make a 3-D Linear's result, as GPT-2's graph has)
are evaluated in float64 on probe points and compared with the tanh formula (``_is_tanh_gelu``). HF's
NewGELU and FastGELU, ``F.gelu(approximate='tanh')`` whole or decomposed by ``decomp.py``, all match;
the erf GELU (0.5e-3 apart at its farthest) and anything else do not.

When (``_lt_addmm``; Blas.cpp ``isInputCompliesAddmmCudaLt``, torch 2.11): beta == alpha == 1, a 1-D
contiguous bias of length N, every size of x [M, K] and w [K, N] > 1, dtype fp16/bf16 (also fp32 and
fp64 there; see DTYPES), x and w dense (required before CUDA 12.1), not ``DISABLE_ADDMM_CUDA_LT=1``.
Where Lt would decline, ATen runs addmm then a separate GELU, which is what the Triton kernel already
does better (it fuses the GELU with what follows), so the graph is left alone.
Nor where ``small_mm`` takes the matmul (``2*M*K*N <= opts.small_mm_flops``, default mode only): there
the call's host time counts, a SmallMM is one Triton launch, and the Lt path asks cuBLASLt for an
algorithm on every call; a GPT-2 124M batch (8x512 rows: 19 GFLOP) is far above that.

Inference only, by construction: the addmm's result and every node of the formula must have no user
outside the formula (a training forward graph saves the pre-activation, or a piece of the formula, for
the backward's ``gelu`` derivative: that extra user stops the rewrite; the fused op has no backward
that could give the pre-activation back).

Precision: the epilogue adds the bias and applies GELU on the fp32 accumulator and rounds once; eager
rounds the pre-activation to bf16 first (and HF's formula rounds after every op). The result differs
from eager's by bf16 rounding only: about one bf16 ulp (2^-8 relative), inside the bf16 tolerance the
native tests use (1.6e-2, ``tests/native/harness.TOL``).
"""
from __future__ import annotations

import math

import torch

from ember.config import environment
from ember.native import mm_epilogue
from ember.native.fx_match import is_call
from ember.native.mm_epilogue import VIEWS, Epilogue  # noqa: F401  (VIEWS: kept for rewrites here)

aten = torch.ops.aten
prims = torch.ops.prims

DEVICES = ("cuda",)  # (CPU's _addmm_activation is the erf GELU: module docstring)
# fp32 would take the Lt path too, but the epilogue's tanh accuracy is not documented to fp32's 1.3e-5
# tolerance; for fp16/bf16 the output's rounding dominates whatever it is
DTYPES = (torch.float16, torch.bfloat16)
# ops a spelled-out tanh GELU is made of (evaluated in float64 by _is_tanh_gelu; converts are identity there)
FORMULA_OPS = {
    aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.mul.Scalar, aten.add.Scalar,
    aten.pow.Tensor_Scalar, aten.tanh.default, aten.gelu.default, prims.convert_element_type.default,
    aten._to_copy.default,  # (gelu's decomposition upcasts bf16 to fp32 and back: ``_is_convert``)
}
MAX_FORMULA_NODES = 16  # (NewGELU decomposed: 8 nodes; torch's decomposition with converts: ~12)
# probe points: the formula's whole shape (both tails, the bend around 0) in float64
PROBE = torch.cat([torch.linspace(-8.0, 8.0, 161, dtype=torch.float64),
                   torch.tensor([-0.123, 0.0371, 0.7071, 2.345, -3.21], dtype=torch.float64)])
PROBE_TOL = 1e-7  # (the formulas' constants are sqrt(2/pi) to ~1e-10 at worst; erf GELU is 5e-4 away)


def _tanh_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def fuse_tanh_gelu(gm: torch.fx.GraphModule, small_mm_flops: int = 0) -> int:
    """``gelu_tanh(addmm(bias, x, w))`` -> ``_addmm_activation(bias, x, w, use_gelu=True)`` where
    cuBLASLt takes it and the matmul has more than ``small_mm_flops`` FLOPs (module docstring).
    Returns the count."""
    if environment.get("DISABLE_ADDMM_CUDA_LT") == "1":  # (ATen would run addmm + gelu: Triton's is better)
        return 0

    def qualifies(n) -> bool:
        if not _lt_addmm(n):
            return False
        (m, k), cols = _val(n.args[1]).shape, _val(n.args[2]).shape[1]
        return 2 * m * k * cols > small_mm_flops  # (small_mm's below: one Triton launch)
    return mm_epilogue.fuse(gm, qualifies, EPILOGUES)


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def _lt_addmm(n) -> bool:
    """n is ``addmm(bias, x, w)`` (beta = alpha = 1) that cuBLASLt runs with its bias epilogue: Blas.cpp's
    ``isInputCompliesAddmmCudaLt`` on the meta values, sizes static."""
    if not is_call(n, aten.addmm.default, None, None, None):  # (no kwargs: beta = alpha = 1)
        return False
    out, (bias, x, w) = _val(n), [_val(a) for a in n.args]
    if not all(isinstance(t, torch.Tensor) for t in (out, bias, x, w)):
        return False
    if out.device.type not in DEVICES or out.dtype not in DTYPES:
        return False
    if any(t.dtype != out.dtype or t.device != out.device for t in (bias, x, w)):
        return False
    if bias.dim() != 1 or x.dim() != 2 or w.dim() != 2:
        return False
    sizes = (*x.shape, *w.shape, bias.shape[0])
    if not all(type(s) is int for s in sizes) or min(sizes) <= 1 or bias.shape[0] != w.shape[1]:
        return False
    # bias read as a plain vector by the epilogue; dense x and w: Lt's rule before CUDA 12.1
    return bias.is_contiguous() and _dense(x) and _dense(w)


def _dense(t) -> bool:
    """t's elements fill its storage span without gaps or overlaps, in some order of its dims."""
    expect = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def _formula(pre):
    """(node computing tanh-GELU of ``pre``, the other nodes of the formula) where every use of
    ``pre`` and of those nodes is inside the formula; else None."""
    region, frontier = [], list(pre.users)
    while frontier and len(region) < MAX_FORMULA_NODES:  # pointwise nodes computed from pre alone
        u = frontier.pop(0)
        if u in region or u.op != "call_function" or u.target not in FORMULA_OPS:
            continue
        if u.target is aten._to_copy.default and not _is_convert(u):
            continue
        if not all(a is pre or a in region for a in u.all_input_nodes):
            continue  # (another tensor enters: maybe later, once its other argument is in the region)
        region.append(u)
        frontier.extend(u.users)
    order = {m: i for i, m in enumerate(pre.graph.nodes)}
    region.sort(key=order.__getitem__)
    dtype = _val(pre).dtype
    for out in region:  # the smallest closed formula that computes the GELU, in pre's dtype
        if not isinstance(_val(out), torch.Tensor) or _val(out).dtype != dtype:
            continue
        part = _ancestors(out, pre, set(region))
        if not set(pre.users) <= part or any(m is not out and not set(m.users) <= part for m in part):
            continue
        nodes = sorted(part, key=order.__getitem__)
        if _is_tanh_gelu(pre, nodes):
            return out, [m for m in nodes if m is not out]
    return None


# the activations fuse_tanh_gelu moves into the epilogue (mm_epilogue.fuse): only the tanh GELU, which is
# what CUDA's _addmm_activation(use_gelu=True) computes (module docstring: "Which GELU")
EPILOGUES = (Epilogue("tanh GELU", _formula, use_gelu=True),)


def _is_convert(n) -> bool:
    """n is ``_to_copy(x, dtype=<floating>)``: a cast and nothing else (no device or layout change)."""
    dtype = n.kwargs.get("dtype")
    return (len(n.args) == 1 and set(n.kwargs) == {"dtype"} and isinstance(dtype, torch.dtype)
            and dtype.is_floating_point)


def _ancestors(out, pre, region):
    """The nodes of ``region`` that ``out`` is computed from, and ``out``."""
    seen, todo = set(), [out]
    while todo:
        m = todo.pop()
        if m in seen or m is pre:
            continue
        seen.add(m)
        todo.extend(a for a in m.all_input_nodes if a in region)
    return seen


def _is_tanh_gelu(pre, nodes) -> bool:
    """The formula ``nodes`` (graph order, the last is its result) evaluated in float64 on PROBE
    equals the tanh GELU within PROBE_TOL."""
    env = {pre: PROBE}

    def arg(a):
        return env[a] if isinstance(a, torch.fx.Node) else a
    try:
        for m in nodes:
            if m.target in (prims.convert_element_type.default, aten._to_copy.default):
                env[m] = env[m.args[0]]  # (fp32 upcasts of bf16: exact in float64)
                continue
            env[m] = m.target(*[arg(a) for a in m.args], **{k: arg(v) for k, v in m.kwargs.items()})
    except (KeyError, RuntimeError, TypeError):
        return False
    got = env[nodes[-1]]
    return isinstance(got, torch.Tensor) and got.shape == PROBE.shape and got.dtype == torch.float64 \
        and bool(torch.allclose(got, _tanh_gelu(PROBE), rtol=PROBE_TOL, atol=PROBE_TOL))
