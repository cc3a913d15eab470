"""CPU linear layers through MKL's packed GEMM, with the packed weight cached across calls.

Why: for a small batch, ``addmm(bias, x, w.t())`` on CPU spends much of its time re-laying the
weight out for the GEMM's inner kernel on every call. MKL can do that once
(``torch.ops.mkl._mkl_reorder_linear_weight``, cblas_sgemm_pack) and multiply against the packed copy
(``torch.ops.mkl._mkl_linear``). On the 2-core Xeon VM of ``benchmarks/cpu_suite.py`` (1 thread,
noisy): x[32,1024] @ w[1024,1024]^T + b 745 us -> 499 us, x[32,512] @ w[512,1024]^T 329 us -> 223 us;
at M=2048 (the encoder row) it is no faster, at N=10 slower (a loop timing each call shape; the
machine was shared, so these are indicative). torch.compile does this only with ``freezing=True``, where the weights become constants and a
later in-place update is silently ignored; here the packed copy is a cache that is checked each call.

Where: the wrapper's extern calls of ``aten.addmm``/``aten.mm`` on CPU fp32 whose second operand is
a graph input read as its transpose (a Linear's weight, ``[N, K]`` contiguous) and whose sizes fall
in ``RULES`` become ``PackedLinear`` calls (``plan``; the native option ``packed_linear`` turns
it off; training forward graphs never get it: their weights change every step).

Safety (never a stale result): the cache holds the weight as it was packed (an alias, which keeps
its storage alive, so no other tensor can reuse that address) and its version counter. A call uses
the packed copy only while the weight passed in has the same data pointer, sizes and ``_version``:
an optimizer step, ``load_state_dict``, ``w.add_(1)`` under no_grad, ``.data = other`` (a new
storage) all re-pack or, while the weight keeps changing, run plain ``addmm``. A weight is packed
when it is a ``Parameter`` or was seen unchanged on the previous call, so a graph whose "weight" is a
fresh tensor each call never pays for packing. As with autograd's saved-tensor check, a write that
bypasses the version counter (``w.data.add_(1)``: ``.data`` has a counter of its own) is not seen;
inference tensors (no version counter) never use the cache. Memory: the packed copies of a process
are capped at ``BUDGET_BYTES`` (MKL's copy is several times the weight's size).

Dynamic batch: ``_mkl_linear`` runs its packed GEMM only at the batch it was packed for and a plain
GEMM otherwise (tests/native/test_packed_linear.py checks both against eager); the wrapper's
sizes are static here, so that path only matters if a graph's guards are off.

Large batch with an activation: oneDNN. ``cpu_mm.fuse_activations`` turns a large ``addmm`` followed
by ReLU/GELU into ``_addmm_activation``, which on CPU fills its [M, N] result with the broadcast bias,
runs the GEMM with beta=1 and then the activation as one more pass over the result. oneDNN's linear
with a packed weight (``torch.ops.mkldnn._reorder_linear_weight`` once, ``_linear_pointwise`` each
call) adds the bias and applies the activation in the GEMM's epilogue while each tile is in cache:
on the encoder row's first Linear (x[2048, 256] @ w[1024, 256]^T + b, ReLU; 1 thread, thread CPU
time, 100 interleaved calls on the shared VM) 6.30 ms -> 5.61 ms median, p10 5.74 -> 5.17 ms, at the
cost of a plain ``mm`` (5.22 / 4.99 ms). Without an activation oneDNN's packed GEMM measured within
noise of ``mm`` at M=2048 (and the bias of such an ``addmm`` is added in a fused kernel already,
``cpu_mm.unfuse_bias``), so only ``_addmm_activation`` goes there (``ONEDNN_OPS``). Results equal
eager's bit for bit on this build (eager's fp32 GEMMs and epilogues run the same arithmetic); the
same cache and safety rules as MKL's packed copy apply.
"""
from __future__ import annotations

import torch

from ember.native.ir import BufferArg

aten = torch.ops.aten

# (op, largest M, smallest N): where the packed GEMM measured faster than addmm at 1 and 2 threads
# (2-core Xeon VM, fp32). M: rows of x (the batch); N: output features. Above M=128 MKL's own packing
# is amortized over the rows (M=512, 2048: equal or slower); below N=64 the packed call's fixed cost
# wins (N=10: 24 us vs 16-20 us).
RULES = {"addmm": (128, 64), "mm": (128, 64)}
OPS = {aten.addmm.default: "addmm", aten.mm.default: "mm", aten._addmm_activation.default: "addmm_act"}
# ops run through oneDNN's packed linear with a fused epilogue (module docstring), from this many rows
# (cpu_mm.MIN_ROWS: the only rows _addmm_activation is made for); activation -> (attr, algorithm)
ONEDNN_OPS = {"addmm_act": 129}
ONEDNN_ACTS = {False: ("relu", ""), True: ("gelu", "none")}  # (use_gelu: _addmm_activation's erf GELU)
STATS = {"packs": 0, "packed_calls": 0}  # (tests read these)
# MKL's packed copy is 2-5x the weight's size (x[32] @ [1024, 512]: 5x, [3072, 768] at M=128: 2.2x),
# so the packed copies of one process are capped: past this many bytes, further sites run addmm
# (a model of hundreds of MiB of fp32 weights would otherwise hold several times that again)
BUDGET_BYTES = 512 << 20
_live = [0]  # bytes of packed copies held now


def _nbytes(packed: torch.Tensor) -> int:
    return packed.numel() * packed.element_size()  # (an opaque MKL tensor: no storage to ask)


def claims(op: str, M: int, N: int) -> bool:
    """Do the rules give an ``op`` ("addmm", "mm": RULES, MKL's packed GEMM; "addmm_act": ONEDNN_OPS,
    oneDNN's with the activation in its epilogue) of M rows and N output features a packed GEMM
    (given a weight that is a graph input, in the layout ``plan`` checks)?"""
    if op in ONEDNN_OPS:
        return M >= ONEDNN_OPS[op] and N > 0
    max_m, min_n = RULES.get(op, (0, 0))
    return 0 < M <= max_m and N >= min_n


def available() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def onednn_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def plan(e, layouts: dict, input_names: set) -> str | None:
    """Source of a ``PackedLinear(...)`` replacing extern node ``e`` (wrapper ``extern_overrides``),
    or None when it keeps its ATen op. ``layouts``: buffer name -> Layout; ``input_names``: the
    buffers that are graph inputs (placeholders or constants)."""
    op = OPS.get(e.target)
    if op is None:
        return None
    act = None
    if op == "addmm_act":
        if set(e.kwargs) - {"use_gelu"} or e.kwargs.get("use_gelu", False) not in ONEDNN_ACTS or not onednn_available():
            return None
        act = ONEDNN_ACTS[e.kwargs.get("use_gelu", False)][0]
    elif e.kwargs or not available():
        return None
    args = e.args
    if op in ("addmm", "addmm_act"):
        if len(args) != 3:
            return None
        bias, x, wt = args
    else:
        if len(args) != 2:
            return None
        bias, (x, wt) = None, args
    if not all(isinstance(a, BufferArg) for a in (x, wt)) or not (bias is None or isinstance(bias, BufferArg)):
        return None
    if len(x.sizes) != 2 or len(wt.sizes) != 2 or not all(type(s) is int for s in (*x.sizes, *wt.sizes)):
        return None
    (M, K), N = x.sizes, wt.sizes[1]
    if not (claims(op, M, N) and K > 0) or wt.sizes[0] != K:
        return None
    if wt.name not in input_names:  # a weight computed in the graph changes every call
        return None
    # every operand is its whole buffer, laid out as _mkl_linear reads it: the wrapper passes the
    # buffers themselves (x [M, K] and the weight [N, K] row-major, bias [N]); for oneDNN's sites x
    # may also be a contiguous buffer of another shape, which the wrapper views as [M, K] (MKL's small
    # sites keep whole buffers only: the ones they were measured on)
    want = {x.name: ((M, K), (K, 1)), wt.name: ((N, K), (K, 1))}
    if bias is not None:
        want_bias = ((N,), (1,))
        if bias.name in want or (tuple(bias.sizes), tuple(bias.strides)) != want_bias:
            return None
        want[bias.name] = want_bias
    if x.name == wt.name or tuple(x.strides) != (K, 1) or tuple(wt.strides) != (1, K):
        return None
    for a in (x, wt, bias):
        if a is None:
            continue
        lay = layouts.get(a.name)
        if a.offset != 0 or lay is None or lay.dtype != torch.float32 or lay.device.type != "cpu":
            return None
        if (tuple(lay.sizes), tuple(lay.strides)) != want[a.name] and not (a is x and act and _contiguous(lay, M * K)):
            return None
    return f"PackedLinear({op!r}, {M}, {N}, {K}, {act!r})" if act else f"PackedLinear({op!r}, {M}, {N}, {K})"


def _contiguous(lay, numel: int) -> bool:
    """lay is a contiguous buffer of ``numel`` elements: x [M, K] is a view of it (a 3-D Linear's input;
    the wrapper passes that view)."""
    sizes = tuple(lay.sizes)
    if not all(type(v) is int for v in sizes):
        return False
    n, expect = 1, []
    for v in reversed(sizes):
        expect.append(n)
        n *= v
    return n == numel and all(v == 1 or st == ex for v, st, ex in zip(sizes, lay.strides, reversed(expect)))


class PackedLinear:
    """``addmm(bias, x, w.t())`` (or ``mm(x, w.t())``, or ``_addmm_activation(bias, x, w.t())`` with
    ``act`` "relu"/"gelu") called as ``(bias, x, w)`` / ``(x, w)`` with the weight ``w`` as stored
    ([N, K]); one instance per call site, holding that site's packed weight (module docstring: when
    it is used; MKL's packed GEMM, oneDNN's for ``act``)."""
    __slots__ = ("op", "M", "N", "K", "act", "seen", "packed")

    def __init__(self, op: str, M: int, N: int, K: int, act: str | None = None):
        if (op == "addmm_act") != (act is not None):
            raise ValueError(f"PackedLinear({op!r}): an activation goes with op 'addmm_act' only, got act={act!r}")
        self.op, self.M, self.N, self.K, self.act = op, M, N, K, act
        self.seen = None    # (alias, version) of an unpacked weight at the previous call
        self.packed = None  # (alias, version, packed weight)

    def __call__(self, *args):
        if self.op == "mm":
            (x, w), bias = args, None
        else:
            bias, x, w = args
        p = self._packed(w)
        if self.act is not None:
            if p is None:
                return torch.ops.aten._addmm_activation(bias, x, w.t(), use_gelu=self.act == "gelu")
            STATS["packed_calls"] += 1
            return torch.ops.mkldnn._linear_pointwise(x, p, bias, self.act, [], "none" if self.act == "gelu" else "")
        if p is None:
            return torch.addmm(bias, x, w.t()) if bias is not None else torch.mm(x, w.t())
        STATS["packed_calls"] += 1
        return torch.ops.mkl._mkl_linear(x, p, w, bias, self.M)

    def _packed(self, w: torch.Tensor):
        if w.is_inference():  # no version counter to tell an update by
            return None
        version, ptr = w._version, w.data_ptr()
        hit = self.packed
        if hit is not None and hit[1] == version and hit[0].data_ptr() == ptr and hit[0].shape == w.shape:
            return hit[2]
        seen = self.seen
        stable = seen is not None and seen[1] == version and seen[0].data_ptr() == ptr and seen[0].shape == w.shape
        if not (stable or isinstance(w, torch.nn.Parameter)):
            self.seen = (w.detach(), version)
            return None
        self.seen = None
        self._drop()  # the old copy goes before the new one is made
        if self.act is not None:  # oneDNN's blocked layout for a batch of M rows
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), self.M)
        else:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), self.M)
        size = _nbytes(packed)
        if _live[0] + size > BUDGET_BYTES:
            return None
        _live[0] += size
        STATS["packs"] += 1
        self.packed = (w.detach(), version, packed)
        return packed

    def _drop(self):
        hit, self.packed = self.packed, None
        if hit is not None:
            _live[0] -= _nbytes(hit[2])

    def __del__(self):
        try:
            self._drop()
        except Exception:  # noqa: BLE001 - (interpreter shutdown: the module's globals may be gone)
            pass

    def __repr__(self):
        act = f", {self.act!r}" if self.act else ""
        return f"PackedLinear({self.op!r}, {self.M}, {self.N}, {self.K}{act})"
