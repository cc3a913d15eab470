"""Triton source for one scheduled ``Kernel``.

Three shapes of kernel:

* pointwise: 1-D blocks of ``XBLOCK`` elements over the flattened ranges;
* persistent reduction: an ``[XBLOCK, RBLOCK]`` tile holds whole rows (``RBLOCK >= rnumel``), so every
  value is loaded once and kept in registers; reductions, their prologues and epilogues share it;
* looped reduction: ``for roffset in range(0, rnumel, RBLOCK)`` accumulates ``[XBLOCK, RBLOCK]``
  partials. A reduction that reads an earlier reduction of the same kernel (softmax's sum reads its
  max) needs the finished value, so it runs in a later loop ("stage"); inner values are recomputed in
  each loop that needs them rather than kept.

Values live in registers in their compute dtype (fp16/bf16 as fp32); loads upcast, stores downcast.
Casts to fp16/bf16 between ops of one kernel do not round (as in the reference compiler): the fp32
value is more accurate than eager's, and a GELU or layer norm in bf16 would otherwise spend ~2
instructions per cast per element, enough to make it compute-bound on an H100.
``EMBER_EMULATE_PRECISION_CASTS=1`` (option ``emulate_precision_casts``) rounds them, for bit-closer
agreement with eager. Index math is int32 unless a buffer or the iteration space reaches 2**31
elements. Loads/stores are masked at tails; ``masked`` subexpressions (cat, pad) mask their loads
further, so no address outside a buffer is touched.

Symbolic sizes: ``xnumel``, ``rnumel`` and the size symbols the index math uses (renamed ``ks0``,
``ks1``... in order of use) are run-time arguments that Triton does not specialize on
(``do_not_specialize``), so one binary serves every size. Block sizes come from the symbols' hints
(``_config``); a reduction over a symbolic rnumel is persistent only under a known bound. Int32 index
math chosen at the hints lists the sizes it needs below 2**31 (``int32_limits``) for the wrapper to
check.
"""
from __future__ import annotations

import dataclasses
import math
import types

import sympy
import torch

from ember.native import ir, ops, triton_welford
from ember.native.scope import Names, Scope, node_value
from ember.native.scheduler import Kernel
from ember.native.split_reduction import contiguous_reduction
from ember.native.symbolic import is_static, print_expr
from ember.native.options import NativeOptions
from ember.config import environment

TL_DTYPE = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
LOW_PRECISION = (torch.float16, torch.bfloat16)

# how each pointwise op is spelled in Triton, and which are costly (HEAVY): the op registry, ops.py

# the least size a symbolic size's hint counts as when choosing block sizes (see _config)
SYMBOLIC_HINT_FLOOR = 1024

# Looped reductions along a strided dim with many outputs (the partial kernels of split_reduction's
# rule for strided reductions: BatchNorm statistics and weight gradients of channels-last
# activations): (most buffers read and written, XBLOCK, RBLOCK, num_warps, L2 hints: OUTER_EVICTION),
# the first row that holds the kernel. Measured on an H100 at ResNet-50's shapes
# (benchmarks/results/outer_reduction-nvidia-h100-s36.json, chunks of 256-1024 rows): the BN+ReLU
# backward sums with a residual (7 streams) ran at 90% of a copy's bandwidth with 64x64 tiles and 8
# warps (64x32/4 warps within 3%; 16x256/8 warps, the old tile, 25-45% slower). BatchNorm's forward
# statistics (var_mean's Welford pair: x read, two partials written) take 32x64 tiles, 4 warps, with
# hints: at today's 896/896/448-row chunks of 64x{64x112x112, 256x56x56, 512x28x28} bf16, 46.6 / 47.4
# / 27.8 us against 50.2 / 50.1 / 30.1 us with the former 64x16 tiles and no hints (torch.compile
# 47.6 us at 256x56x56); each of tile and hints helps alone, 3-6% and 2-4%
# (benchmarks/results/ln_gelu_sweep-nvidia-h100-s38.json). In 2048-row chunks the same tile ran 43 us
# there (benchmarks/results/outer_reduction-fwd-nvidia-h100-s37.json): a chunk rule for
# split_reduction. XBLOCK is at most split_reduction.OUTER_XBLOCK, the programs it counts per 64
# outputs (more, never fewer).
OUTER_CONFIGS = (
    (3, 32, 64, 4, True),
    (None, 64, 64, 8, False),
)
# the hints of the rows that ask for them (EVICTION's meaning): the chunk's rows are read once, the
# per-output values (a Welford shift) by every chunk
OUTER_EVICTION = {"stream": "evict_first", "reused": "evict_last"}


# Warps of a reduction's program by the elements of its [XBLOCK, RBLOCK] tile: (most elements,
# warps, warps when the kernel computes a costly function per element: ops.HEAVY, gelu's erf), the
# first row that holds. 8-16 elements per thread: 16-byte vector loads, few registers.
# Persistent tiles (whole rows in registers; rows of up to 4096 elements share 4096-element tiles,
# XBLOCK rows each: choose_config): a whole 8K+ row gets 16 warps. Heavy ones get half from 4096
# elements on: more elements per thread hide a compute-bound tail better (layer_norm+gelu bf16 on an
# H100, 4096-wide rows at 88% of an fp32 copy's bandwidth with 4 warps against 86% with 8, 768-wide
# 76% against 72%; light kernels (layer_norm, softmax) stay within 2% either way:
# benchmarks/probes/persistent_warps.py). Session 38's sweep of layer_norm+gelu bf16 rows, D = 768 ...
# 8192 at ~130 MB each (benchmarks/results/ln_gelu_sweep-nvidia-h100-s38.json, CUDA-graph timing):
# these rows' configs were the best measured or within 3% (the run-to-run spread of one config) at
# every width; 8192x4096 ran 48.0-49.6 us, 90-93% of the 1 GiB copy peak (no-erf floor 48 us: not
# compute-bound); other XBLOCK/warps 1-17% slower, a grid-stride loop over rows 25-50% slower, and
# L2 hints (PERSISTENT_HINTS) within 2%, so none are on.
PERSISTENT_WARPS = (
    (127, 1, 1),
    (511, 2, 2),
    (2047, 4, 4),
    (8191, 8, 4),
    (None, 16, 8),
)
# Looped tiles (the r-loop streams; the same warps whatever the per-element cost)
LOOPED_WARPS = (
    (127, 1, 1),
    (511, 2, 2),
    (2047, 4, 4),
    (None, 8, 8),
)

# L2 eviction hints of a looped (non-persistent, one-pass) reduction, as Inductor writes them: the
# rows streamed through the r-loop are read once ("stream": leave L2 to others), the per-output
# values loaded once before the loop are read by many programs ("reused": keep them).
# Empty: no hints (benchmarks/probes/outer_reduction.py sweeps both).
EVICTION: dict = {}
# The same for persistent row reductions (whole rows in registers, one pass): "rows": loads that vary
# with x (each program's own rows, read once), "shared": loads that do not (a layer norm's weight and
# bias, read by every program), and "store": a cache modifier for the stores of whole tiles
# (".cs": streaming, written once). Empty: no hints (benchmarks/probes/ln_gelu_sweep.py sweeps them).
PERSISTENT_HINTS: dict = {}


def compute_dtype(dt):
    return torch.float32 if dt in LOW_PRECISION else dt


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (1 for n < 1)."""
    return 1 << (max(n, 1).bit_length() - 1)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@dataclasses.dataclass
class LaunchConfig:
    XBLOCK: int
    RBLOCK: int | None
    num_warps: int
    persistent: bool
    num_stages: int | None = None  # None: Triton's default (only looped reductions pipeline loads)
    hints: bool = False  # OUTER_EVICTION on a one-pass looped reduction's loads (OUTER_CONFIGS' rows)


@dataclasses.dataclass
class EmittedKernel:
    source: str                 # the kernel function (named KERNEL_NAME until deduplicated)
    kind: str                   # poi | per | red
    args: list                  # buffer names passed as pointers, in order
    xnumel: object              # int, or a size expression (passed at run time)
    rnumel: object
    config: LaunchConfig
    comment: str                # provenance lines
    size_args: list = dataclasses.field(default_factory=list)     # size symbols passed as ks0, ks1...
    int32_limits: list = dataclasses.field(default_factory=list)  # sizes that must stay < 2**31 (int32 math)
    rnumel_arg: bool = False    # rnumel is passed after xnumel (symbolic), not as launch metadata
    # masks written as constant true (``_mask``): another XBLOCK/RBLOCK must divide the size too
    exact_x: bool = False
    exact_r: bool = False

    @property
    def symbolic(self) -> bool:
        return bool(self.size_args) or not (is_static(self.xnumel) and is_static(self.rnumel))


def choose_config(k: Kernel, options: NativeOptions, inner_reduction: bool, persistent_ok: bool = True,
                  heavy: bool = False) -> LaunchConfig:
    """Block sizes from Inductor-like heuristics; ``options`` may cap them (tests force small
    blocks so mask tails and several loop iterations get exercised). ``k`` has int sizes (hints for
    symbolic kernels); ``persistent_ok=False`` when no bound on rnumel is known; ``heavy``: the
    kernel computes a costly function per element (``ops.HEAVY``)."""
    max_x, max_r = options.max_xblock, options.max_rblock
    if not k.is_reduction:
        n = k.numel
        # powers of two only: tl.arange needs them (the interpreter does not check, real Triton does)
        xb = min(next_pow2(n), max(256, prev_pow2(min(n // 128, 1024))), max_x)
        return LaunchConfig(xb, None, 4 if xb >= 512 else (2 if xb >= 128 else 1), False)
    xn, rn = k.xnumel, k.rnumel
    # Persistent: whole rows in registers, one read of the input. Up to 8192 elements for rows along
    # the contiguous dim (measured on H100: softmax 8192x4096 fp32 94 us vs 109 us looped; the Triton
    # fused-softmax tutorial keeps rows whole too); for reductions across rows only small ones, as
    # the tile must stay wide along x to coalesce.
    limit = options.persistent_rnumel if inner_reduction else 64
    if persistent_ok and next_pow2(rn) <= min(limit, max_r):
        rb = next_pow2(rn)
        cap = 128 if inner_reduction else 64
        xb = max(1, min(next_pow2(xn), max(1, 4096 // rb), cap, max_x))
        persistent = True
    else:
        if inner_reduction:
            xb, rb = 1, min(next_pow2(rn), 2048, max_r)
        else:
            # x is the contiguous dim. Many outputs (split_reduction cuts long strided reductions
            # into short chunks): a small tile per program, by how many buffers stream through
            streams = len(getattr(k, "reads", ())) + len(getattr(k, "writes", ()))
            _, xb, rb, warps, hints = next(row for row in OUTER_CONFIGS if row[0] is None or streams <= row[0])
            # (at least one program per SM: split_reduction_programs is two per SM)
            if -(-xn // min(xb, max_x)) >= options.split_reduction_programs // 2:
                return LaunchConfig(min(xb, max_x), min(next_pow2(rn), rb, max_r), warps, False, hints=hints)
            # few outputs (the final kernel of a split reduction, a short one): a long tile along r,
            # 16+ elements along x to keep loads coalesced, fewer when that leaves too few programs
            # (aim at ~512; sum over dim 0 of 8192x4096 fp32: 67 us, was 132 us with 64)
            xb = min(64, max(16, next_pow2(-(-xn // 512))), next_pow2(xn), max_x)
            rb = min(next_pow2(rn), max(1, 4096 // xb), max_r)
        xb = min(xb, max_x)
        persistent = False
    elems = xb * rb
    table = PERSISTENT_WARPS if persistent else LOOPED_WARPS
    _, light, costly = next(row for row in table if row[0] is None or elems <= row[0])
    return LaunchConfig(xb, rb, costly if heavy else light, persistent)


class _Scope(Scope):
    """A block of straight-line code with its own CSE cache; loop bodies get a child scope."""

    def __init__(self, parent=None, mask="xmask", hoist_to=None):
        super().__init__(parent)
        self.mask, self.hoist_to = mask, hoist_to


_LOOP_INDEX_TEXT: dict = {}  # index over loop variables only -> (its text, how many loop variables it needs)
_FREE_SYMBOLS: dict = {}  # sympy expression -> its free symbols (sympy recomputes them per call)


def _free_symbols(expr) -> set:
    """expr.free_symbols, memoized (a shared set: never change it)."""
    hit = _FREE_SYMBOLS.get(expr)
    if hit is None:
        if len(_FREE_SYMBOLS) >= 100_000:
            _FREE_SYMBOLS.clear()
        hit = _FREE_SYMBOLS[expr] = expr.free_symbols
    return hit


def _loop_vars_needed(syms) -> int | None:
    """1 + the highest ``v{i}`` among syms (0 for none), or None if another symbol is among them."""
    need = 0
    for s in syms:
        name = s.name
        if not (name.startswith("v") and name[1:].isdigit()) or s != ir.sym(name):
            return None
        need = max(need, int(name[1:]) + 1)
    return need


class TritonKernelEmitter(Names):
    def __init__(self, k: Kernel, layouts: dict, options: NativeOptions, sv: ir.SizeVars | None = None):
        self.k, self.layouts, self.options = k, layouts, options
        self.sv = sv or ir.SizeVars()
        self.size_names: dict = {}       # size symbol -> kernel parameter name
        self.args: list[str] = []        # buffer names in pointer order
        self.ptr: dict[str, str] = {}
        self.nodes = {n.name: n for n in k.nodes}
        self.tmp = 0
        self.outer_vals: dict = {}       # reductions/outer nodes -> variable
        self.xaccs: list = []            # (node, accumulator, dtype) of cross-x reductions
        self._rlevel: dict = {}
        self.block_masks: set = set()    # masks of masked() values that vary over the loops
        sizes = [k.numel] + [layouts[b].storage_numel for b in list(k.reads) + list(k.writes)]
        self.int64 = max(self.sv.hint(n) for n in sizes) >= 2 ** 31
        # int32 index math chosen from hints holds only while the sizes stay below 2**31: the wrapper
        # checks these per call (and runs the graph as it is past them)
        self.int32_limits = [] if self.int64 else [n for n in sizes if not is_static(n)]
        self.vars = ir.node_vars(len(k.ranges))
        self.kept = [i for i in range(len(k.ranges)) if i not in k.reduced]
        # an op's cheaper spelling (erf as a rational function, a few float32 ulps off libdevice's)
        # when every node computing it rounds its result to bf16/fp16, as gelu on half tensors
        # does: the error is far below one rounding step, and libdevice's erf made such kernels
        # compute-bound
        used = {n.name: {x.op for x in ir.walk([k.bodies[n.name]])} for n in k.nodes}
        self.heavy = any(o & ops.HEAVY for o in used.values())
        self.lowp_ops = {name for name in set().union(*used.values()) & ops.LOWP_RENDERED
                         if all(n.layout.dtype in LOW_PRECISION for n in k.nodes if name in used[n.name])}

    # -- names ---------------------------------------------------------------------------------
    def emit_line(self, scope, code):
        name = self.new_tmp()
        scope.lines.append(f"{name} = {code}")
        return name

    # -- index printing ------------------------------------------------------------------------
    def index_str(self, expr, indirect=None):
        # an index over loop variables only prints the same in every kernel (``v{i}``): memoized,
        # as kernels of every layer print the same indices (sizes and indirect values are named
        # per kernel, in order of use, so those are printed each time)
        plain = not indirect and isinstance(expr, sympy.Basic)
        if plain:
            hit = _LOOP_INDEX_TEXT.get(expr)
            if hit is not None and hit[1] <= len(self.vars):
                return hit[0]
        names = {**{v: f"v{i}" for i, v in enumerate(self.vars)}, **(indirect or {})}
        text = print_expr(expr, lambda s: names[s] if s in names else self.size_name(s))
        if plain:
            nvars = _loop_vars_needed(_free_symbols(expr))
            if nvars is not None:
                if len(_LOOP_INDEX_TEXT) >= 100_000:
                    _LOOP_INDEX_TEXT.clear()
                _LOOP_INDEX_TEXT[expr] = (text, nvars)
        return text

    def _depends_on(self, expr, which):
        syms = _free_symbols(expr) if isinstance(expr, sympy.Basic) else set()
        pos = self.k.reduced if which == "r" else self.kept
        return any(self.vars[i] in syms for i in pos)

    # -- expressions ---------------------------------------------------------------------------
    def value(self, e: ir.Expr, scope: _Scope, mask=None):
        key = (e, mask)
        hit = scope.lookup(key)
        if hit is not None:
            return hit
        if scope.hoist_to is not None and mask is None and e.op != "const" and not self.r_level(e):
            return self.value(e, scope.hoist_to)  # loop-invariant: compute once before the r loop
        out = self._value(e, scope, mask)
        scope.cache[key] = out
        return out

    def _value(self, e, scope, mask):
        if e.op == "load":
            return self.load(e, scope, mask)
        if e.op == "const":
            return self.emit_line(scope, f"tl.full([], {_literal(e.attr, e.dtype)}, {TL_DTYPE[compute_dtype(e.dtype)]})")
        if e.op == "index":
            if not e.attr.free_symbols:  # e.g. the index of a size-1 dim
                return self.emit_line(scope, f"tl.full([], {int(e.attr)}, {TL_DTYPE[e.dtype]})")
            code = self.index_str(e.attr)
            return self.emit_line(scope, f"({code}).to({TL_DTYPE[e.dtype]})" if e.dtype != torch.int32 else code)
        if e.op == "cast":
            return self.cast(self.value(e.args[0], scope, mask), e.args[0].dtype, e.dtype, scope)
        if e.op == "masked":
            m = self.value(e.args[0], scope, mask)
            inner = m if mask is None else self.emit_line(scope, f"{mask} & {m}")
            if mask in self.block_masks or self._varies(e.args[0]):
                self.block_masks.add(inner)
            body = self.value(e.args[1], scope, inner)
            other = _literal(e.attr, e.dtype)
            return self.emit_line(scope, f"tl.where({m}, {body}, {other})")
        args = [self.value(a, scope, mask) for a in e.args]
        return self.emit_line(scope, ops.render("triton", e, args, e.op in self.lowp_ops))

    def cast(self, v, src, dst, scope):
        csrc, cdst = compute_dtype(src), compute_dtype(dst)
        if dst == torch.bool:
            return self.emit_line(scope, f"{v} != 0")
        if dst in LOW_PRECISION and self.options.emulate_precision_casts:
            # round like eager stores each op's result, keep computing in fp32
            return self.emit_line(scope, f"{v}.to({TL_DTYPE[dst]}).to(tl.float32)")
        if csrc == cdst:
            return v
        return self.emit_line(scope, f"{v}.to({TL_DTYPE[cdst]})")

    def load(self, e, scope, mask):
        buf, index, syms = e.attr
        if buf in self.nodes:  # computed in this kernel: the scheduler checked the index matches
            return self.node_value(buf, scope)
        ind = {s: self.value(a, scope, mask) for s, a in zip(syms, e.args)}
        ptr = self.pointer(buf)
        idx = self.index_str(index, ind)
        # mask by what the address depends on: r -> the r-loop's mask, only x -> xmask,
        # nothing -> a scalar address that is always valid
        if self._depends_on(index, "r") or any(self.r_level(a) for a in e.args):
            m = scope.mask
        elif syms or self._depends_on(index, "x"):
            m = "xmask"
        else:
            m = None
        addr = f"{ptr} + ({idx})"
        if (m is not None and not self._depends_on(index, "x") and not self._depends_on(index, "r")
                and not any(self._varies(a) for a in e.args)):
            # an indirect address that is a scalar after all (its index loaded from a scalar address:
            # cross_entropy's target at batch 1) under a block mask: Triton wants a block of pointers
            addr = f"tl.broadcast_to({addr}, ({m}).shape)"
        if mask is not None:
            if m is None and mask in self.block_masks:
                # a scalar address under a block mask (cat/pad of a broadcast value): Triton's load
                # wants a block of pointers then
                addr = f"tl.broadcast_to({addr}, {mask}.shape)"
            m = mask if m is None else f"{m} & {mask}"
        hint = self._eviction(index, e)
        code = f"tl.load({addr}{hint})" if m is None else f"tl.load({addr}, {m}, other=0{hint})"
        dt = self.layouts[buf].dtype
        if dt in LOW_PRECISION:
            code += ".to(tl.float32)"
        return self.emit_line(scope, code)

    def _eviction(self, index, e) -> str:
        """``, eviction_policy=...`` for a load of a one-pass looped reduction (EVICTION) or of a
        persistent one (PERSISTENT_HINTS), else ''."""
        if not self.evict:
            return ""
        if self.cfg.persistent:
            policy = self.evict.get("rows" if self._depends_on(index, "x") else "shared")
        elif self._depends_on(index, "r") or any(self.r_level(a) for a in e.args):
            policy = self.evict.get("stream")
        else:
            policy = self.evict.get("reused")
        return f", eviction_policy={policy!r}" if policy else ""

    def _varies(self, e: ir.Expr) -> bool:
        """Does e depend on a loop variable (so it is a block, not a scalar)?"""
        for x in ir.walk([e]):
            index = x.attr if x.op == "index" else x.attr[1] if x.op == "load" else None
            if x.op == "load" and x.attr[0] in self.nodes:
                return True
            if index is not None and (self._depends_on(index, "x") or self._depends_on(index, "r")):
                return True
        return False

    def r_level(self, e: ir.Expr) -> bool:
        """Does e vary along r (so it lives in an [XBLOCK, RBLOCK] tile)?"""
        hit = self._rlevel.get(e)
        if hit is None:
            if e.op == "load":
                buf = e.attr[0]
                if buf in self.nodes:
                    hit = self.k.roles[buf] == "inner"
                else:
                    hit = self._depends_on(e.attr[1], "r") or any(self.r_level(a) for a in e.args)
            elif e.op == "index":
                hit = self._depends_on(e.attr, "r")
            else:
                hit = any(self.r_level(a) for a in e.args)
            self._rlevel[e] = hit
        return hit

    # -- nodes ---------------------------------------------------------------------------------
    node_value = node_value  # (scope.py: shared by both renderers)

    def store(self, name, v, scope, mask):
        n = self.nodes[name]
        ptr = self.pointer(name, out=True)
        dt = n.layout.dtype
        if dt in LOW_PRECISION:
            v = f"{v}.to({TL_DTYPE[dt]})"
        index = self.k.stores[name]
        idx = self.index_str(index)
        if mask is None:  # after a single program's x loop: one [1, 1] element
            scope.lines.append(f"tl.store({ptr} + ({idx}) + tl.zeros([1, 1], tl.int32), {v})")
            return
        if not self._depends_on(index, "x") and not self._depends_on(index, "r"):
            idx += " + 0 * xindex"  # a block of pointers, so the block mask applies
        hint = ""
        if self.cfg.persistent and self.evict.get("store") and self._depends_on(index, "r"):
            hint = f", cache_modifier={self.evict['store']!r}"
        scope.lines.append(f"tl.store({ptr} + ({idx}), {v}, {mask}{hint})")

    # -- kernel bodies -------------------------------------------------------------------------
    def stages(self):
        """Loop stage of every node (see module docstring); outer nodes run after their loop."""
        st = {}
        for n in self.k.nodes:
            role = self.k.roles[n.name]
            if role == "final":
                continue
            deps = [l.attr[0] for l in ir.loads_of(self.k.bodies[n.name]) if l.attr[0] in self.nodes
                    and l.attr[0] != self.welford_sq.get(n.name)]  # (a Welford pair: one loop)
            s = 0 if role not in ("outer", "xred") else -1
            for d in deps:
                dr = self.k.roles[d]
                if role in ("outer", "xred"):
                    s = max(s, st[d])
                else:
                    s = max(s, st[d] if dr == "inner" else st[d] + 1)
            st[n.name] = s
        return st

    def generate(self) -> EmittedKernel:
        k = self.k
        inner_red = self._inner_reduction()
        cfg = self._config(inner_red)
        self.cfg = cfg
        self.welford = triton_welford.pairs(self)  # {A: B}: var_mean's sums in one Welford loop
        self.welford_sq = {b: a for a, b in self.welford.items()}
        self.evict: dict = {}  # EVICTION while emitting a one-pass r-loop (_looped), PERSISTENT_HINTS in _persistent
        self.exact: set = set()  # "x"/"r": which masks _mask wrote as constant true
        body: list[str] = []
        idx_t = ".to(tl.int64)" if self.int64 else ""
        pid = f"tl.program_id(0){idx_t}"
        if not k.is_reduction:
            body += [f"xoffset = {pid} * XBLOCK", f"xindex = xoffset + tl.arange(0, XBLOCK){idx_t}",
                     self._mask("xmask", "xindex < xnumel", k.xnumel, cfg.XBLOCK, "[XBLOCK]")]
            body += self._var_defs(self.kept, "xindex")
            scope = _Scope(mask="xmask")
            for n in k.nodes:
                v = self.node_value(n.name, scope)
                if n.name not in k.local:
                    self.store(n.name, v, scope, "xmask")
            body += scope.lines
            kind = "poi"
        else:
            fscope = _Scope(mask=None)  # function level: only single-program kernels use it
            block = [f"xindex = xoffset + tl.arange(0, XBLOCK)[:, None]{idx_t}",
                     self._mask("xmask", "xindex < xnumel", k.xnumel, cfg.XBLOCK, "[XBLOCK, 1]")]
            block += self._var_defs(self.kept, "xindex")
            if cfg.persistent:
                block += [f"rindex = tl.arange(0, RBLOCK)[None, :]{idx_t}",
                          self._mask("rmask", "rindex < rnumel", k.rnumel, cfg.RBLOCK, "[1, RBLOCK]")]
                block += self._var_defs(list(k.reduced), "rindex")
                block += self._persistent(fscope)
                kind = "per"
            else:
                block += [f"rbase = tl.arange(0, RBLOCK)[None, :]{idx_t}"]
                block += self._looped(fscope)
                kind = "red"
            if k.single:
                body += fscope.lines  # accumulator inits
                body += ["for xoffset in range(0, xnumel, XBLOCK):"] + ["    " + l for l in block]
                body += self._finish_single(fscope)
            else:
                body += [f"xoffset = {pid} * XBLOCK"] + block
        # Static loop bounds are constexprs. A symbolic rnumel is a run-time argument (Triton does not
        # specialize size arguments: one binary serves every size), except under the interpreter:
        # Triton 3.6's cannot take range() over a run-time int under numpy 2 (it holds scalars as
        # 1-element arrays), and a constexpr costs nothing there (it compiles nothing).
        sizes = [self.size_names[s] for s in self.size_names]
        dynamic = list(sizes)
        xn = "xnumel: tl.constexpr" if k.single else "xnumel"
        if not is_static(k.xnumel):
            dynamic.append("xnumel")
        params = [self.ptr[b] for b in self.args] + sizes + [xn]
        rnumel_arg = k.is_reduction and not is_static(k.rnumel)
        if k.is_reduction:
            if rnumel_arg and not (kind == "red" and _interpreted()):
                params.append("rnumel")
                dynamic.append("rnumel")
            else:
                params.append("rnumel: tl.constexpr")
        params += ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if k.is_reduction else [])
        deco = f"@triton.jit(do_not_specialize={dynamic!r})" if dynamic else "@triton.jit"
        src = [deco, f"def KERNEL_NAME({', '.join(params)}):"] + ["    " + l for l in body]
        return EmittedKernel("\n".join(src) + "\n", kind, list(self.args), k.xnumel, k.rnumel, cfg,
                             provenance(k), size_args=list(self.size_names), int32_limits=self.int32_limits,
                             rnumel_arg=rnumel_arg, exact_x="x" in self.exact, exact_r="r" in self.exact)

    def _mask(self, name, cond, numel, block, shape) -> str:
        """``name = cond``, or a constant all-true mask when the static size is a multiple of the
        block: Triton then folds the selects away and emits unpredicated vector loads and stores
        (a persistent row of exactly RBLOCK, a pointwise size that the grid covers exactly)."""
        if is_static(numel) and numel > 0 and numel % block == 0:
            self.exact.add(name[0])
            return f"{name} = tl.full({shape}, True, tl.int1)  # {cond}: always true at these sizes"
        return f"{name} = {cond}"

    def _config(self, inner_red) -> LaunchConfig:
        """choose_config at the hints. A symbolic size is expected to vary, so its hint counts as
        at least ``SYMBOLIC_HINT_FLOOR`` (a block sized for a tiny first call would launch far too
        many programs later; a large block on a tiny call only masks lanes off). A reduction over a
        symbolic rnumel stays persistent only when a bound on it (mark_dynamic's max) fits the
        persistent limit; otherwise it loops."""
        k, sv = self.k, self.sv
        if all(is_static(n) for n in (k.numel, k.xnumel, k.rnumel)):
            return choose_config(k, self.options, inner_red, heavy=self.heavy)

        def hint(n):
            return n if is_static(n) else max(sv.hint(n), SYMBOLIC_HINT_FLOOR)

        def at(rnumel):
            return types.SimpleNamespace(is_reduction=k.is_reduction, numel=hint(k.numel), xnumel=hint(k.xnumel),
                                         rnumel=rnumel)
        bound = k.rnumel if is_static(k.rnumel) else sv.upper_bound(k.rnumel)
        if bound is not None:
            cfg = choose_config(at(bound), self.options, inner_red, heavy=self.heavy)
            if cfg.persistent or is_static(k.rnumel):
                return cfg
        return choose_config(at(hint(k.rnumel)), self.options, inner_red, persistent_ok=False, heavy=self.heavy)

    def _inner_reduction(self):
        for n in self.k.nodes:
            if self.k.roles[n.name] == "red":
                sizes = {v: self.sv.hint(r) for v, r in zip(self.vars, self.k.ranges)}
                return contiguous_reduction(self.k.bodies[n.name], self.vars[self.k.reduced[-1]], sizes)
        return True

    def _var_defs(self, positions, base):
        sizes = [self.k.ranges[i] for i in positions]
        out = []
        for j, i in enumerate(positions):
            stride = math.prod(sizes[j + 1:])
            e = base if stride == 1 else f"({base} // {_wrap(self.index_str(stride))})"
            if j > 0:
                e = f"{e} % {_wrap(self.index_str(sizes[j]))}"
            out.append(f"v{i} = {e}")
        return out

    def _persistent(self, fscope):
        scope = _Scope(fscope, mask="xmask & rmask")
        self.evict = PERSISTENT_HINTS if not self.k.single else {}
        for n in self.k.nodes:
            role = self.k.roles[n.name]
            if role == "final":
                continue
            if role == "xred":
                self._xaccumulate(n, self.value(self.k.bodies[n.name], scope), scope, fscope)
            elif role == "red":
                v = self.value(self.k.bodies[n.name], scope)
                r = self._reduce_tile(n, v, scope, "xmask & rmask")
                self.outer_vals[n.name] = self.cast(r, self.k.bodies[n.name].dtype, n.layout.dtype, scope)
                if n.name not in self.k.local:
                    self.store(n.name, self.outer_vals[n.name], scope, "xmask")
            elif role == "outer":
                v = self.value(self.k.bodies[n.name], scope)
                self.outer_vals[n.name] = self.cast(v, self.k.bodies[n.name].dtype, n.layout.dtype, scope)
                if n.name not in self.k.local:
                    self.store(n.name, self.outer_vals[n.name], scope, "xmask")
            else:
                v = self.node_value(n.name, scope)
                if n.name not in self.k.local:
                    self.store(n.name, v, scope, "xmask & rmask")
        return scope.lines

    def _reduce_tile(self, n, v, scope, mask):
        """Reduce a full [XBLOCK, RBLOCK] tile (masked lanes get the identity) along axis 1."""
        rt = n.reduction_type
        cdt = compute_dtype(self.k.bodies[n.name].dtype)
        v = self.emit_line(scope, f"tl.broadcast_to({v}, [XBLOCK, RBLOCK])")
        if rt in ("argmax", "argmin"):
            ident = _identity("max" if rt == "argmax" else "min", cdt)
            vv = self.emit_line(scope, f"tl.where({mask}, {v}, {ident})")
            ri = self.emit_line(scope, "tl.broadcast_to(rindex, [XBLOCK, RBLOCK])")
            out = self.new_tmp()
            scope.lines.append(f"_, {out} = tl.reduce(({vv}, {ri}), 1, {rt}_combine)")
            return self.emit_line(scope, f"{out}[:, None].to(tl.int64)")
        if rt in ("any", "all"):
            v = self.emit_line(scope, f"{v}.to(tl.int8)")
            cdt = torch.int8
        ident = _identity(rt, cdt)
        vv = self.emit_line(scope, f"tl.where({mask}, {v}, {ident})")
        red = self.emit_line(scope, _final_reduce(rt, vv, cdt))
        if rt in ("any", "all"):
            red = self.emit_line(scope, f"{red} != 0")
        return red

    def _looped(self, fscope):
        k = self.k
        stages = self.stages()
        top = _Scope(fscope, mask="xmask")
        nstages = max([s for s in stages.values()] + [0]) + 1
        # a second r-loop would read the streamed rows again: hints only for a single pass
        self.evict = (EVICTION or (OUTER_EVICTION if self.cfg.hints else {})) if nstages == 1 and not k.single else {}
        for n in k.nodes:  # outer nodes that need no reduction of this kernel
            if k.roles[n.name] in ("outer", "xred") and stages[n.name] < 0:
                self._outer(n, top, fscope)
        for s in range(nstages):
            reds = [n for n in k.nodes if k.roles[n.name] == "red" and stages[n.name] == s]
            stores = [n for n in k.nodes if k.roles[n.name] == "inner" and stages[n.name] == s
                      and n.name not in k.local]
            if not reds and not stores:
                continue
            accs = {}
            wf_names = [n.name for n in reds if n.name in self.welford]
            wf = triton_welford.StageWelford(self, wf_names, top) if wf_names else None
            if wf:
                wf.shifts(top)
            for n in reds:
                if n.name not in self.welford and n.name not in self.welford_sq:
                    accs[n.name] = self._init_acc(n, top)
            loop = _Scope(top, mask="xmask & rmask", hoist_to=top)
            loop.lines += ["rindex = roffset + rbase",
                           self._mask("rmask", "rindex < rnumel", k.rnumel, self.cfg.RBLOCK, "[1, RBLOCK]")]
            loop.lines += self._var_defs(list(k.reduced), "rindex")
            loop.lines += wf.count_lines() if wf else []
            for n in k.nodes:
                if n in reds:
                    if n.name in self.welford_sq:
                        continue  # (its pair's Welford update computes it)
                    v = self.value(k.bodies[n.name], loop)
                    if n.name in self.welford:
                        wf.update(n.name, v, loop)
                    else:
                        self._accumulate(n, v, accs[n.name], loop)
                elif n in stores:
                    self.store(n.name, self.node_value(n.name, loop), loop, "xmask & rmask")
            top.lines.append("for roffset in range(0, rnumel, RBLOCK):")
            top.lines += ["    " + l for l in loop.lines]
            for n in reds:
                if n.name in self.welford_sq:
                    continue
                if n.name in self.welford:
                    self._finish_welford(n.name, wf, top)
                    continue
                r = self._finish_acc(n, accs[n.name], top)
                self.outer_vals[n.name] = self.cast(r, k.bodies[n.name].dtype, n.layout.dtype, top)
                if n.name not in k.local:
                    self.store(n.name, self.outer_vals[n.name], top, "xmask")
            for n in k.nodes:
                if k.roles[n.name] in ("outer", "xred") and stages[n.name] == s:
                    self._outer(n, top, fscope)
        return top.lines

    def _finish_welford(self, a, wf, top):
        """A (the sum: mean * n) and B (M2) of a Welford pair; its readers of A / n get the mean."""
        k, b = self.k, self.welford[a]
        mean, m2 = wf.finish(a, top)
        top.cache[(triton_welford.mean_expr(k, b), None)] = mean
        total = self.emit_line(top, f"{mean} * {_literal(float(k.rnumel), k.bodies[a].dtype)}")
        for name, v in ((a, total), (b, m2)):
            self.outer_vals[name] = self.cast(v, k.bodies[name].dtype, self.nodes[name].layout.dtype, top)
            if name not in k.local:
                self.store(name, self.outer_vals[name], top, "xmask")

    def _outer(self, n, scope, fscope):
        v = self.value(self.k.bodies[n.name], scope)
        if self.k.roles[n.name] == "xred":
            self._xaccumulate(n, v, scope, fscope)
            return
        self.outer_vals[n.name] = self.cast(v, self.k.bodies[n.name].dtype, n.layout.dtype, scope)
        if n.name not in self.k.local:
            self.store(n.name, self.outer_vals[n.name], scope, "xmask")

    # -- single-program kernels: reductions across x and the scalars computed from them ----------
    def _xaccumulate(self, n, v, scope, fscope):
        rt = n.reduction_type
        cdt = torch.int8 if rt in ("any", "all") else compute_dtype(self.k.bodies[n.name].dtype)
        acc = f"_xacc{self.tmp}"
        self.tmp += 1
        fscope.lines.append(f"{acc} = tl.full([XBLOCK, 1], {_identity(rt, cdt)}, {TL_DTYPE[cdt]})")
        v = self.emit_line(scope, f"tl.broadcast_to({v}, [XBLOCK, 1])")
        if rt in ("any", "all"):
            v = self.emit_line(scope, f"{v}.to(tl.int8)")
        combine = {"sum": "{a} + {v}", "prod": "{a} * {v}", "max": "maximum({a}, {v})", "min": "minimum({a}, {v})",
                   "any": "tl.maximum({a}, {v})", "all": "tl.minimum({a}, {v})"}[rt]
        scope.lines.append(f"{acc} = tl.where(xmask, {combine.format(a=acc, v=v)}, {acc})")
        self.xaccs.append((n, acc, cdt))

    def _finish_single(self, fscope):
        """After the loop over x: finish the cross-x reductions, then the final scalar nodes."""
        scope = _Scope(mask=None)
        scope.cache = {}
        for n, acc, cdt in self.xaccs:
            r = self.emit_line(scope, _final_reduce(n.reduction_type, acc, cdt, axis=0))
            if n.reduction_type in ("any", "all"):
                r = self.emit_line(scope, f"{r} != 0")
            self.outer_vals[n.name] = self.cast(r, self.k.bodies[n.name].dtype, n.layout.dtype, scope)
            if n.name not in self.k.local:
                self.store(n.name, self.outer_vals[n.name], scope, None)
        for n in self.k.nodes:
            if self.k.roles[n.name] == "final":
                v = self.value(self.k.bodies[n.name], scope)
                self.outer_vals[n.name] = self.cast(v, self.k.bodies[n.name].dtype, n.layout.dtype, scope)
                if n.name not in self.k.local:
                    self.store(n.name, self.outer_vals[n.name], scope, None)
        return scope.lines

    def _init_acc(self, n, scope):
        rt, cdt = n.reduction_type, compute_dtype(self.k.bodies[n.name].dtype)
        name = f"_acc{self.tmp}"
        self.tmp += 1
        if rt in ("any", "all"):
            scope.lines.append(f"{name} = tl.full([XBLOCK, RBLOCK], {_identity(rt, torch.int8)}, tl.int8)")
        elif rt in ("argmax", "argmin"):
            ident = _identity("max" if rt == "argmax" else "min", cdt)
            scope.lines.append(f"{name} = tl.full([XBLOCK, RBLOCK], {ident}, {TL_DTYPE[cdt]})")
            scope.lines.append(f"{name}_idx = tl.full([XBLOCK, RBLOCK], 2147483647, tl.int32)")
        else:
            scope.lines.append(f"{name} = tl.full([XBLOCK, RBLOCK], {_identity(rt, cdt)}, {TL_DTYPE[cdt]})")
        return name

    def _accumulate(self, n, v, acc, scope):
        rt = n.reduction_type
        m = "xmask & rmask"
        v = self.emit_line(scope, f"tl.broadcast_to({v}, [XBLOCK, RBLOCK])")
        if rt in ("argmax", "argmin"):
            ri = self.emit_line(scope, "tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int32)")
            nv, ni = self.new_tmp(), self.new_tmp()
            scope.lines.append(f"{nv}, {ni} = {rt}_combine({acc}, {acc}_idx, {v}, {ri})")
            scope.lines.append(f"{acc} = tl.where({m}, {nv}, {acc})")
            scope.lines.append(f"{acc}_idx = tl.where({m}, {ni}, {acc}_idx)")
            return
        if rt in ("any", "all"):
            v = self.emit_line(scope, f"{v}.to(tl.int8)")
        combine = {"sum": "{a} + {v}", "prod": "{a} * {v}", "max": "maximum({a}, {v})", "min": "minimum({a}, {v})",
                   "any": "tl.maximum({a}, {v})", "all": "tl.minimum({a}, {v})"}[rt]
        scope.lines.append(f"{acc} = tl.where({m}, {combine.format(a=acc, v=v)}, {acc})")

    def _finish_acc(self, n, acc, scope):
        rt = n.reduction_type
        if rt in ("argmax", "argmin"):
            out = self.new_tmp()
            scope.lines.append(f"_, {out} = tl.reduce(({acc}, {acc}_idx), 1, {rt}_combine)")
            return self.emit_line(scope, f"{out}[:, None].to(tl.int64)")
        cdt = torch.int8 if rt in ("any", "all") else compute_dtype(self.k.bodies[n.name].dtype)
        red = self.emit_line(scope, _final_reduce(rt, acc, cdt))
        if rt in ("any", "all"):
            red = self.emit_line(scope, f"{red} != 0")
        return red


def _final_reduce(rt, v, cdt, axis=1):
    floating = cdt.is_floating_point
    keep = "[:, None]" if axis == 1 else "[None, :]"
    if rt == "sum":
        return f"tl.sum({v}, {axis}){keep}"
    if rt == "prod":
        return f"tl.reduce({v}, {axis}, prod_combine){keep}"
    if rt in ("max", "any"):
        return (f"max_nan_reduce({v}, {axis})" if floating else f"tl.max({v}, {axis})") + keep
    if rt in ("min", "all"):
        return (f"min_nan_reduce({v}, {axis})" if floating else f"tl.min({v}, {axis})") + keep
    raise AssertionError(rt)


def _identity(rt, dt):
    if rt in ("sum", "any"):
        return "0"
    if rt in ("prod", "all"):
        return "1"
    if dt.is_floating_point:
        return "float('-inf')" if rt == "max" else "float('inf')"
    if dt == torch.bool:
        return "0" if rt == "max" else "1"
    info = torch.iinfo(dt)
    return str(info.min if rt == "max" else info.max)


def _literal(value, dtype):
    if isinstance(value, bool) or dtype == torch.bool:
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    return str(int(value))


def _wrap(s: str) -> str:
    return s if s.replace("_", "").isalnum() else f"({s})"


def _interpreted() -> bool:
    return environment.triton_interpret


def provenance(k: Kernel) -> str:
    ops, lines = [], []
    for n in k.nodes:
        for op, st in n.origins:
            if op not in ops:
                ops.append(op)
            if st and st not in lines:
                lines.append(st)
    out = [f"# ATen ops: {', '.join(ops)}"]
    out += [f"# source: {l}" for l in lines[:8]]
    return "\n".join(out)


def kernel_name(k: Kernel, kind: str, i: int) -> str:
    ops = []
    for n in k.nodes:
        for op, _ in n.origins:
            short = op.split(".")[0].strip("_")
            if short not in ops:
                ops.append(short)
    return f"triton_{kind}_fused_{'_'.join(ops[:6]) or 'copy'}_{i}"


def emit_kernel(k: Kernel, layouts: dict, options: NativeOptions, sv: ir.SizeVars | None = None) -> EmittedKernel:
    return TritonKernelEmitter(k, layouts, options, sv).generate()
