"""Small matmuls as one Triton launch instead of an ATen (cuBLAS) call, in every mode.

Why: a matmul of a few MFLOP runs in a few microseconds on an H100, but its ATen call costs far more
CPU than that: dispatch, cuBLASLt's heuristic and workspace lookups. On the H100 host of our runs one
``aten.addmm`` of a batch-32 MLP took 18-26 us of CPU (``benchmarks/probes/mlp_split.py``), and the
whole compiled MLP call with three of these launches 75 us against eager's 127 us (gpu_suite). Small-batch calls are bound by that CPU time, so
eager, torch.compile and ember all wait on it; a kernel whose sizes and strides are baked in does not.

The kernel is autotune's ``ember_mm`` (the max-autotune matmul template) with a heuristic config: no
timing at compile time. Only 2-D ``mm``/``addmm`` with static sizes, one float dtype, and at most
``small_mm_flops`` (native option) of work qualify: below that the tensor cores are idle most of the
kernel anyway, so a config that is not the best one costs little device time. Larger matmuls keep
cuBLAS (or max-autotune's timed choice).

Activations. A ReLU or (erf) GELU applied to such a matmul's result runs in the matmul's epilogue:
the FX pass ``fuse_activations`` rewrites ``addmm`` and the activation's ops into one
``ember_native::addmm_act`` (or ``addmm_act2``, which also returns the value before the activation,
when a training graph keeps it for the backward). A small MLP layer is then one launch and one
allocation instead of two, which is what its per-call CPU time is made of. The ops have eager
implementations, used wherever the matmul does not become a ``SmallMM`` after all.
"""
from __future__ import annotations

import operator

import torch
import triton

from ember.native.fx_match import gelu_of as _gelu_of, is_call as _is_call
from ember.native.ir import BufferArg
from ember.config import environment
from ember.native.options import NativeOptions

OPS = ("mm", "addmm", "addmm_act", "addmm_act2")
_tf32_allowed = torch._C._get_cublas_allow_tf32
_empty_strided = torch.empty_strided  # (torch.empty with its memory-format argument costs more per call)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
aten = torch.ops.aten


# ---- addmm + activation as one op ----------------------------------------------------------------
def _act(x: torch.Tensor, activation: str) -> torch.Tensor:
    return torch.relu(x) if activation == "relu" else torch.nn.functional.gelu(x)


@torch.library.custom_op("ember_native::addmm_act", mutates_args=())
def addmm_act(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(addmm(bias, a, b))``, activation "relu" or "gelu" (erf form)."""
    return _act(torch.addmm(bias, a, b), activation)


@torch.library.custom_op("ember_native::addmm_act2", mutates_args=())
def addmm_act2(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pre, act(pre))`` with ``pre = addmm(bias, a, b)``."""
    pre = torch.addmm(bias, a, b)
    return pre, _act(pre, activation)


@addmm_act.register_fake
def _(bias, a, b, activation):
    return a.new_empty((a.shape[0], b.shape[1]))


@addmm_act2.register_fake
def _(bias, a, b, activation):
    return a.new_empty((a.shape[0], b.shape[1])), a.new_empty((a.shape[0], b.shape[1]))


def _qualifies(n, opts: NativeOptions, on_cpu: bool) -> bool:
    """Would ``n`` (an ``addmm`` node) become a SmallMM: 2-D static float, small, no alpha/beta?"""
    if not _is_call(n, aten.addmm.default, None, None, None):
        return False
    vals = [getattr(x, "meta", {}).get("val") for x in (n, *n.args)]
    if not all(isinstance(v, torch.Tensor) for v in vals) or not (vals[0].device.type == "cuda" or on_cpu):
        return False
    out, a, b = vals[0], vals[2], vals[3]
    if out.dim() != 2 or a.dim() != 2 or b.dim() != 2 or out.dtype not in DTYPES or len({v.dtype for v in vals}) != 1:
        return False
    sizes = [*out.shape, *a.shape]
    if not all(type(s) is int for s in sizes):
        return False
    return 0 < 2 * a.shape[0] * a.shape[1] * b.shape[1] <= opts.small_mm_flops


def fuse_activations(gm: torch.fx.GraphModule, opts: NativeOptions, on_cpu: bool = False) -> int:
    """FX pass: ``act(addmm(...))`` -> ``addmm_act`` for the matmuls that will be SmallMMs (module
    docstring); ``addmm_act2`` when the pre-activation value has other users. Returns the count."""
    if not opts.small_mm_flops:
        return 0
    g, fused = gm.graph, 0
    for n in list(g.nodes):
        if not _qualifies(n, opts, on_cpu):
            continue
        relu = [u for u in n.users if _is_call(u, aten.relu.default, n)]
        match = (relu[0], [], "relu") if relu else (*(_gelu_of(n) or (None, None)), "gelu")
        act, inner, kind = match
        if act is None:
            continue
        if act.meta["val"].dtype != n.meta["val"].dtype:
            continue
        keep = any(u is not act and u not in inner for u in n.users)
        with g.inserting_before(n.next):  # (where n's other users, if any, can see ``pre``)
            if keep:
                both = g.call_function(torch.ops.ember_native.addmm_act2.default, (*n.args, kind))
                both.meta["val"] = (n.meta["val"], act.meta["val"])
                pre = g.call_function(operator.getitem, (both, 0))
                post = g.call_function(operator.getitem, (both, 1))
                pre.meta["val"], post.meta["val"] = n.meta["val"], act.meta["val"]
            else:
                post = g.call_function(torch.ops.ember_native.addmm_act.default, (*n.args, kind))
                post.meta["val"] = act.meta["val"]
        act.replace_all_uses_with(post)
        for x in [act, *reversed(inner)]:
            g.erase_node(x)
        if keep:
            n.replace_all_uses_with(pre)
        g.erase_node(n)
        fused += 1
    if fused:
        gm.recompile()
    return fused


def plan(e, layouts: dict, opts: NativeOptions) -> str | None:
    """Source of a ``SmallMM(...)`` replacing extern node ``e``, or None when it keeps its ATen op."""
    limit = opts.small_mm_flops
    schema = getattr(e.target, "_schema", None)
    if not limit or schema is None or e.target._overloadname != "default":
        return None
    op = schema.name.split("::")[-1]
    if op not in OPS or e.multi != (op == "addmm_act2"):
        return None
    tensors, activation = list(e.args), ""
    if op.startswith("addmm_act"):
        tensors, activation = tensors[:3], tensors[3]
        if activation not in ("relu", "gelu"):
            return None
    if not all(isinstance(t, BufferArg) for t in tensors) or len(tensors) != (2 if op == "mm" else 3):
        return None
    a, b = tensors[-2], tensors[-1]
    if len(a.sizes) != 2 or len(b.sizes) != 2:
        return None
    dtypes = {layouts[t.name].dtype for t in tensors}
    sizes = [v for t in tensors for v in (*t.sizes, *t.strides)]
    if len(dtypes) != 1 or dtypes.pop() not in DTYPES or not all(isinstance(v, int) for v in sizes):
        return None
    (M, K), N = a.sizes, b.sizes[1]
    if min(M, N, K) == 0 or 2 * M * N * K > limit:
        return None
    kw = dict(e.kwargs)
    alpha, beta = kw.pop("alpha", 1), kw.pop("beta", 1)
    if kw or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, beta)):
        return None
    bias = None
    if op != "mm":
        bias = _broadcast_strides(tensors[0], M, N)
        if bias is None:
            return None
    dtype = layouts[a.name].dtype
    act = f", {activation!r}, {op == 'addmm_act2'}" if activation else ""
    return (f"SmallMM({op!r}, {M}, {N}, {K}, {tuple(a.strides)}, {tuple(b.strides)}, {bias}, "
            f"{alpha!r}, {beta!r}, {config(M, N, K, dtype)!r}, {dtype}{act})")


def _broadcast_strides(bias: BufferArg, M: int, N: int):
    """(stride along M, stride along N) of ``bias`` broadcast to [M, N], or None if it does not broadcast."""
    sizes, strides = list(bias.sizes), list(bias.strides)
    while len(sizes) < 2:
        sizes.insert(0, 1)
        strides.insert(0, 0)
    if len(sizes) != 2 or sizes[0] not in (1, M) or sizes[1] not in (1, N):
        return None
    return tuple(0 if s == 1 else st for s, st in zip(sizes, strides))


def config(M: int, N: int, K: int, dtype) -> dict:
    """Tiles no larger than the problem; enough programs that a 32-row batch still spreads over SMs."""
    from ember.native.triton_emit import next_pow2
    bm = min(64, max(16, next_pow2(M)))
    bn = 64 if triton.cdiv(M, bm) * triton.cdiv(N, 64) >= 64 else 32
    bk = min(32 if dtype == torch.float32 else 64, max(16, next_pow2(K)))
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=3)


class SmallMM:
    """Called like the op it replaces, positionally (``addmm(bias, a, b)``/``mm(a, b)``/``addmm_act(bias, a,
    b, activation)``; ``beta`` and ``alpha`` are baked in, so passing them is an error, not a silent
    mismatch); returns a new contiguous [M, N] tensor (``addmm_act2``: two, before and after the
    activation). Per call: one allocation per result and one launch. ``torch.backends.cuda.matmul.allow_tf32`` is read at each call, as cuBLAS does.

    ``site``: the launch for ``dtype`` under the TF32 setting of the time the wrapper was loaded,
    listed with the wrapper's static launch sites so that its kernel is built ahead of the first call
    with the generated ones (``runtime.precompile``)."""

    __slots__ = ("op", "M", "N", "launches", "meta", "site", "keep_pre")

    def __init__(self, op, M, N, K, a_strides, b_strides, bias_strides, alpha, beta, cfg, dtype=torch.float32,
                 activation="", keep_pre=False):
        self.op, self.M, self.N, self.keep_pre = op, M, N, keep_pre
        xs = bias_strides or (0, 0)
        self.meta = dict(M=M, N=N, K=K, stride_ab=0, stride_am=a_strides[0], stride_ak=a_strides[1], stride_bb=0,
                         stride_bk=b_strides[0], stride_bn=b_strides[1], stride_cb=0, stride_cm=N, stride_cn=1,
                         stride_xb=0, stride_xm=xs[0], stride_xn=xs[1], alpha=float(alpha), beta=float(beta),
                         HAS_BIAS=bias_strides is not None and beta != 0, ACTIVATION=activation, STORE_PRE=keep_pre, EVEN_K=K % cfg["BLOCK_K"] == 0,
                         BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=8,
                         num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        self.launches = {}  # TF32 allowed (fp32 only) -> Launch
        key = dtype is torch.float32 and _tf32_allowed()
        self.site = self.launches[key] = self._launch(dtype, key)

    def __call__(self, *args):
        if self.op == "mm":
            (a, b), bias = args, None
        else:  # (addmm_act's activation is baked in: the wrapper passes the three tensors)
            bias, a, b = args
        out = _empty_strided((self.M, self.N), (self.N, 1), dtype=a.dtype, device=a.device)
        # what ``torch.backends.cuda.matmul.allow_tf32`` returns, without its module __getattr__
        # (1.9 us against 0.15 us per read)
        key = a.dtype is torch.float32 and _tf32_allowed()
        launch = self.launches.get(key)
        if launch is None:
            launch = self.launches[key] = self._launch(a.dtype, key)
        if self.keep_pre:
            pre = _empty_strided((self.M, self.N), (self.N, 1), dtype=a.dtype, device=a.device)
            launch.run(a, b, out, out if bias is None else bias, pre)
            return pre, out
        launch.run(a, b, out, out if bias is None else bias, out)
        return out

    def _launch(self, dtype, tf32: bool):
        from ember.native.autotune import ember_mm
        from ember.native.runtime import Launch
        m = self.meta
        grid = (triton.cdiv(self.M, m["BLOCK_M"]) * triton.cdiv(self.N, m["BLOCK_N"]), 1)
        # the interpreter's dot mishandles bf16 (see ember_mm); on a GPU half types feed tensor cores
        upcast = dtype != torch.float32 and environment.triton_interpret
        # TF32 allowed: three TF32 products ("tf32x3", about fp32's accuracy) rather than one. Triton's
        # single TF32 product truncates its inputs: on the batch-32 MLP it landed 2.4e-3 (relative) from
        # eager's cuBLAS TF32, five times eager's own TF32 error; tf32x3 is 4e-4 from eager, and 4e-7
        # from float64 (H100, benchmarks/probes/mm_precision.py). Tensor cores either way, and the launch count does not change.
        meta = dict(m, INPUT_PRECISION="tf32x3" if tf32 else "ieee", UPCAST=upcast)
        return Launch(ember_mm, grid, meta, fresh=(2, 4), spec=(dtype,) * 5)  # (A, B, C, Bias, Pre: one dtype)

    def __repr__(self):
        act = f", {self.meta['ACTIVATION']!r}" if self.meta["ACTIVATION"] else ""
        return f"SmallMM({self.op!r}, {self.M}, {self.N}, {self.meta['K']}{act})"
