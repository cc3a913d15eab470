"""Scheduler: group IR nodes into kernels, order them, decide which buffers live in memory.

Every ``ComputedNode`` starts as its own group; extern nodes are groups that never fuse. Groups that
share data are merged greedily, best score first (bytes shared, vertical before horizontal), until a
round merges nothing; then pointwise groups of at most ``TINY_NUMEL`` elements also merge with each
other without sharing data (one launch instead of several), and so do the final kernels of split
reductions (over at most ``SMALL_REDUCTION_NUMEL`` points, the same iteration space). A kernel has one iteration space: ``ranges`` with the ``reduced`` ones reduced. A node
fits a kernel as

* ``red``:   a reduction over exactly those ranges and reduced dims,
* ``inner``: a pointwise node over all the ranges (a reduction's prologue, or the "normalize" pass
             after it, e.g. softmax's division),
* ``outer``: a pointwise node over the kept ranges only (an epilogue of the reductions).

Two groups merge when their nodes fit one space, every value passed between them is read at exactly
the index it was written (so it can stay in registers), and no third group sits between them (that
would make a cycle). A buffer whose readers all sit in its producer's kernel, and which is not a
graph output, is never written to memory. ``Schedule.report`` gives kernels, externs and bytes moved.

Ranges may be expressions of size symbols (dynamic shapes): iteration spaces and indices are compared
exactly (structurally, after expansion), fusion scores and the report count bytes at the symbols'
hints, and single-program kernels, whose loop bound is a constant, are made for static sizes only.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import sympy
import torch

from ember.native import ir
from ember.native.options import NativeOptions

MAX_FUSED_NODES = 64
# A reduction kernel may also reduce its per-row results across rows when it can run as a single
# program: only for small problems, where one launch instead of two wins
# (NativeOptions.single_program_numel says how small).
# pointwise kernels this small merge with any other of the same size (no shared data needed)
TINY_NUMEL = 1024
# second-stage reductions (of values reductions computed) over this few points (all loops) with the
# same iteration space also merge without shared data: the final kernels of split column sums
# (split_reduction: S partials per output, S * outputs <= split_outer_outputs), e.g. the weight and
# bias gradients of a LayerNorm, ~2-3 us of launch each
SMALL_REDUCTION_NUMEL = 1 << 16


@dataclasses.dataclass
class Kernel:
    name: str
    nodes: list                 # ComputedNode, in program order
    ranges: tuple               # the iteration space (no size-1 dims)
    reduced: tuple              # positions of reduced ranges; () for a pointwise kernel
    roles: dict                 # node name -> "inner" | "outer" | "red"
    bodies: dict                # node name -> body over the kernel's vars v0..vn
    stores: dict                # node name -> store index over the kernel's vars
    local: set                  # buffers computed here that never reach memory
    single: bool = False        # one program loops over x (and may reduce across x)
    reads: list = dataclasses.field(default_factory=list)    # buffers read from memory
    writes: list = dataclasses.field(default_factory=list)   # buffers written to memory
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def is_reduction(self) -> bool:
        return bool(self.reduced)

    @property
    def xnumel(self) -> int:
        return math.prod(r for i, r in enumerate(self.ranges) if i not in self.reduced)

    @property
    def rnumel(self) -> int:
        return math.prod(self.ranges[i] for i in self.reduced)

    @property
    def numel(self) -> int:
        return math.prod(self.ranges)


@dataclasses.dataclass
class Schedule:
    graph: ir.GraphIR
    steps: list                 # Kernel | ExternNode
    last_use: dict              # buffer -> index of the last step that reads it
    outputs: set                # buffers that must survive the call
    report: dict


def kept(ranges, reduced):
    return tuple(r for i, r in enumerate(ranges) if i not in reduced)


def _static(ranges) -> bool:
    return all(isinstance(r, int) for r in ranges)


def reshape_map(own_vars, own_ranges, vars_, ranges):
    """``own_vars`` (a loop nest over ``own_ranges``) as expressions of ``vars_`` (over ``ranges``) when
    both nests visit the same number of points: the point at flat row-major position f of one is the
    point at position f of the other. None if the counts differ or a size is symbolic.

    The same values often come in two shapes: GPT-2's layer norm reduces over [B, T, C] while its
    normalize pass, fused into the view the next matmul reads, runs over [B*T, C]. Mapped this way
    the two fit one kernel; the div/mod the mapping introduces simplifies away when the shapes are
    splits of each other (``v0 -> 16*k0 + k1``; ``k0 -> v0 // 16``, folded back by loop merging)."""
    if not (_static(own_ranges) and _static(ranges)) or math.prod(own_ranges) != math.prod(ranges):
        return None
    return dict(_reshape_map(tuple(own_vars), tuple(own_ranges), tuple(vars_), tuple(ranges)))


@functools.lru_cache(maxsize=4096)
def _reshape_map(own_vars, own_ranges, vars_, ranges) -> tuple:
    """reshape_map's mapping as pairs (cached: fusion asks for the same few shapes many times)."""
    flat, stride = sympy.Integer(0), 1
    for v, r in reversed(list(zip(vars_, ranges))):
        flat, stride = flat + v * stride, stride * r
    known = dict(zip(vars_, ranges))
    out, stride = {}, 1
    for v, r in reversed(list(zip(own_vars, own_ranges))):
        raw = ir.IMod(ir.FloorDiv(flat, stride) if stride != 1 else flat, r)
        simple = ir.simplify_index(raw, known)
        # a position that stays a div/mod is kept in its raw form, of the flat position: in a whole
        # index the digits then join back (symbolic._join_divmod), simplified apart they would not
        out[v] = simple if not simple.has(ir.FloorDiv, ir.IMod) else raw
        stride *= r
    return tuple(out.items())


def place(n: ir.ComputedNode, ranges, reduced, single=False):
    """(role, var mapping) of node n in a kernel over (ranges, reduced), or None if it does not fit.
    ``single``: the kernel runs as one program looping over x, so it can also reduce across x
    (``xred``: a full reduction of kept-shaped values) and compute scalars from those (``final``).
    A node of another shape with as many points fits through ``reshape_map`` (static sizes only).
    The mapping may be shared with other callers: never change it."""
    p = _placed(tuple(n.ranges), tuple(n.reduced), n.reduction_type, tuple(ranges), tuple(reduced), single)
    return None if p is None else p[:2]


@functools.lru_cache(maxsize=8192)
def _placed(n_ranges, n_reduced, reduction_type, ranges, reduced, single):
    """``place`` from what it reads of the node (its shape and reduction), cached: fusion places
    each node anew in every candidate pair, ~17,000 times in a 24-layer Llama's training compile,
    for a few dozen distinct shapes. Returns (role, mapping, the mapping as a tuple of pairs) or None."""
    p = _place(_Shape(n_ranges, n_reduced, reduction_type), ranges, reduced, single)
    return None if p is None else (p[0], p[1], tuple(p[1].items()) if p[1] else ())


class _Shape:
    """What ``_place`` reads of a node."""
    __slots__ = ("ranges", "reduced", "reduction_type")

    def __init__(self, ranges, reduced, reduction_type):
        self.ranges, self.reduced, self.reduction_type = ranges, reduced, reduction_type

    @property
    def is_reduction(self) -> bool:
        return self.reduction_type is not None


def _place(n, ranges, reduced, single):
    vs = ir.node_vars(len(ranges))
    own = ir.node_vars(len(n.ranges))
    k = [i for i in range(len(ranges)) if i not in reduced]
    to_kept = {own[j]: vs[k[j]] for j in range(len(own))} if len(own) == len(k) else None
    K = kept(ranges, reduced)
    if n.is_reduction:
        if tuple(n.ranges) == tuple(ranges) and tuple(n.reduced) == tuple(reduced):
            return "red", {}
        if single and tuple(n.ranges) == K and tuple(n.reduced) == tuple(range(len(K))) \
                and n.reduction_type not in ("argmax", "argmin"):
            return "xred", to_kept
        if reduced and not single:
            nk = [i for i in range(len(n.ranges)) if i not in n.reduced]
            m_kept = reshape_map([own[i] for i in nk], kept(n.ranges, n.reduced), [vs[i] for i in k], K)
            m_red = reshape_map([own[i] for i in n.reduced], [n.ranges[i] for i in n.reduced],
                                [vs[i] for i in reduced], [ranges[i] for i in reduced])
            if m_kept is not None and m_red is not None:
                return "red", {**m_kept, **m_red}
        return None
    if tuple(n.ranges) == tuple(ranges):
        return "inner", {}
    if reduced and tuple(n.ranges) == K:
        return "outer", to_kept
    if single and n.ranges == ():
        return "final", {}
    m = reshape_map(own, n.ranges, vs, ranges)
    if m is not None:
        return "inner", m
    if reduced:
        m = reshape_map(own, n.ranges, [vs[i] for i in k], K)
        if m is not None:
            return "outer", m
    return None


class _Group:
    __slots__ = ("members", "ranges", "reduced", "single", "extern", "order", "rank")

    def __init__(self, node, order):
        self.members = [node]
        self.order = order
        self.rank = order  # the group's place in a topological order of the group graph: Scheduler._merge
        self.extern = isinstance(node, ir.ExternNode)
        self.single = False
        if not self.extern:
            self.ranges = tuple(node.ranges)
            self.reduced = tuple(node.reduced)

    def shape_with(self, other, single_limit):
        """The iteration space (ranges, reduced, single) of self+other, or None."""
        if self.extern or other.extern:
            return None
        return _combine(self, other, single_limit) or _combine(other, self, single_limit)


def _same_points(a, b) -> bool:
    """Loop nests of equal point counts, static sizes (``reshape_map`` can map one onto the other)."""
    return _static(a) and _static(b) and math.prod(a) == math.prod(b)


def _combine(p, q, single_limit):
    if not p.reduced:
        if not q.reduced and (p.ranges == q.ranges or _same_points(p.ranges, q.ranges)):
            return p.ranges, (), False
        return None
    K = kept(p.ranges, p.reduced)
    if q.reduced:
        if (q.ranges, q.reduced) == (p.ranges, p.reduced):
            return p.ranges, p.reduced, p.single or q.single
        if not (p.single or q.single) and _same_points(K, kept(q.ranges, q.reduced)) \
                and _same_points([p.ranges[i] for i in p.reduced], [q.ranges[i] for i in q.reduced]):
            return p.ranges, p.reduced, False
        # q reduces p's per-row results to a scalar: one program can do both (cross-entropy's mean)
        numel = math.prod(p.ranges)  # an int unless symbolic: one program per call needs a known size
        if K and q.ranges == K and q.reduced == tuple(range(len(K))) and not q.single \
                and isinstance(numel, int) and numel <= single_limit:
            return p.ranges, p.reduced, True
        return None
    if q.ranges in (p.ranges, K) or _same_points(q.ranges, p.ranges) or _same_points(q.ranges, K):
        return p.ranges, p.reduced, p.single
    if q.ranges == () and p.single:
        return p.ranges, p.reduced, True
    return None


def _reshaped(mapping) -> bool:
    return any(not isinstance(e, sympy.Symbol) for e in mapping.values())


def _same_index(w, r, ranges) -> bool:
    """Equal indices once reshape_map's div/mod is simplified over the kernel's ranges."""
    if not (w.has(ir.FloorDiv, ir.IMod) or r.has(ir.FloorDiv, ir.IMod)):
        return False
    known = dict(zip(ir.node_vars(len(ranges)), ranges))
    return sympy.expand(ir.simplify_index(w, known) - ir.simplify_index(r, known)) == 0


@functools.lru_cache(maxsize=65536)
def _passes_in_registers(store, store_map, index, load_map, ranges) -> bool:
    """Does a read at ``index`` (mapped by ``load_map``, pairs) see exactly what the write at
    ``store`` (mapped by ``store_map``) stored, in a kernel over ``ranges``? Cached: fusion compares
    the same write/read pairs of every layer (the same indices, the same shapes) again and again."""
    w = sympy.sympify(store).xreplace(dict(store_map))
    r = index.xreplace(dict(load_map))
    return sympy.expand(w - r) == 0 or _same_index(w, r, ranges)


def _draws_random(target) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


def _reads(n):
    """[(buffer, index or None, indirect)] of a node; None index for extern (whole-buffer) reads."""
    if isinstance(n, ir.ExternNode):
        return [(a.name, None, False) for a in ir.buffer_args((n.args, n.kwargs))]
    return [(e.attr[0], e.attr[1], bool(e.attr[2])) for e in ir.loads_of(n.body)]


def _writes(n):
    if isinstance(n, ir.ExternNode):
        return [o[0] for o in n.outputs if o is not None and o[1] is not None]
    return [n.name]


class Scheduler:
    def __init__(self, g: ir.GraphIR, options: NativeOptions | None = None):
        self.g = g
        options = options or NativeOptions()
        self.single_limit = options.single_program_numel
        self.fusion = options.fusion
        self.max_buffers = options.max_fused_buffers  # 0: no limit (see _io)
        self.layouts = g.buffers()
        self.sv = g.sizevars
        self.producer = {}
        self.consumers: dict[str, list] = {}
        self.reads = {}
        for n in g.nodes:
            for b in _writes(n):
                self.producer[b] = n
            self.reads[id(n)] = _reads(n)
            for b, _, _ in self.reads[id(n)]:
                self.consumers.setdefault(b, []).append(n)
        self.outputs = {leaf.name for leaf in _leaves(g.outputs) if isinstance(leaf, ir.OutBuf)}
        self.outputs |= {src for _, src in g.mutations}
        self.group_of = {}
        self.groups = []
        self.live = set()  # the groups not merged away (membership tests per fusion candidate)
        self.pos = {id(n): i for i, n in enumerate(g.nodes)}
        self._succ_cache = {}  # id(group) -> (group, its successors when last asked, _merges then): see _succ
        self._merges = 0
        self._refused = {}  # (id(a), id(b)) -> (a, b, their member counts) of a refused pair: see can_merge
        for i, n in enumerate(g.nodes):
            grp = _Group(n, i)
            self.groups.append(grp)
            self.live.add(grp)
            self.group_of[id(n)] = grp
        self.by_rank = list(self.groups)  # rank -> group (None where a group was merged away)
        # ops drawing random numbers run in program order, each after the one before it: the
        # generator's state is an input of each that no buffer shows (a draw moved before another
        # would give both different numbers than eager)
        self.after = {}  # id(node) -> the next random node
        draws = [n for n in g.nodes if isinstance(n, ir.ExternNode) and _draws_random(n.target)]
        for a, b in zip(draws, draws[1:]):
            self.after[id(a)] = b

    # -- legality ------------------------------------------------------------------------------
    def _succ(self, grp):
        """The groups that read what ``grp`` writes (a set the caller must not change). Cached per
        group: fusion asks for the same ones thousands of times (reachability checks were 37% of
        GPT-2 training's scheduling time under cProfile). A set cached before the last merge is
        brought up to date through ``group_of`` (a merged-away group's nodes belong to the group
        that took them); one cached since is answered as is (``_merges`` counts merges); a group's
        own entry is dropped when it takes another."""
        hit = self._succ_cache.get(id(grp))
        if hit is not None and hit[0] is grp:
            if hit[2] == self._merges:
                return hit[1]
            live = {self.group_of[id(g.members[0])] for g in hit[1]}
            live.discard(grp)
            self._succ_cache[id(grp)] = (grp, live, self._merges)
            return live
        out = set()
        for n in grp.members:
            nxt = self.after.get(id(n))
            if nxt is not None and self.group_of[id(nxt)] is not grp:
                out.add(self.group_of[id(nxt)])
            for b in _writes(n):
                for c in self.consumers.get(b, ()):
                    cg = self.group_of[id(c)]
                    if cg is not grp:
                        out.add(cg)
        self._succ_cache[id(grp)] = (grp, out, self._merges)
        return out

    def _reaches(self, src, dst, skip_direct):
        """Is there a path src -> ... -> dst of length >= 2 (through another group)?

        Only groups ranked before ``dst`` can lie on such a path (``rank`` is a topological order),
        so the search stays between the two groups instead of walking everything downstream of
        ``src``: without that bound each check was linear in the graph and a 24-layer Llama's
        fusion quadratic (a third of its whole CPU compile under cProfile)."""
        limit = dst.rank
        if src.rank > limit:
            return False
        stack = [g for g in self._succ(src) if g is not dst and g.rank < limit] if skip_direct else [src]
        seen = set()
        while stack:
            g = stack.pop()
            if g is dst:
                return True
            if g in seen:
                continue
            seen.add(g)
            for h in self._succ(g):
                if h.rank <= limit and h not in seen:
                    stack.append(h)
        return False

    def can_merge(self, a, b):
        """The merged shape of groups ``a`` and ``b``, or None where they cannot be one kernel.

        A refusal is remembered until either group changes: nothing else can lift it. What it reads
        of the pair (members, their indices) changes only when a merge grows ``a`` or ``b``, and a
        path between them through another group outlives every merge (one that merges the path's
        groups with each other or with a third keeps a path; one that merges them into ``a`` or
        ``b`` grows that group). Fusion rounds and the tiny-pair pass ask the same failed pairs
        again: 8,086 of a 24-layer Llama's 12,994 checks were such repeats."""
        key = (id(a), id(b))
        hit = self._refused.get(key)
        if hit is not None and hit[0] is a and hit[1] is b and hit[2] == len(a.members) and hit[3] == len(b.members):
            return None
        shape = self._can_merge(a, b)
        if shape is None:
            self._refused[key] = (a, b, len(a.members), len(b.members))
        return shape

    def _can_merge(self, a, b):
        shape = a.shape_with(b, self.single_limit)
        if shape is None or len(a.members) + len(b.members) > MAX_FUSED_NODES:
            return None
        ranges, reduced, single = shape
        placed = {}
        for n in a.members + b.members:
            p = _placed(tuple(n.ranges), tuple(n.reduced), n.reduction_type, ranges, reduced, single)
            if p is None:
                return None
            placed[n.name] = p
        # every value passed inside the merged kernel, also between two nodes of one group: in the
        # merged space each node is placed anew, and a group that fits through reshape_map may map
        # one member's rows onto the new kernel's r loop and another's onto its x (a [64, 64]
        # RMSNorm backward: its row kernel taken into the column sum's kernel read the row sums
        # transposed until this covered a group's own pairs)
        members = a.members + b.members
        written = {n.name: n for n in members}
        for q in members:
            for buf, index, indirect in self.reads[id(q)]:
                p = written.get(buf)
                if p is None:
                    continue
                if indirect:
                    return None
                # values reduced across x exist only after the x loop: only "final" nodes read them
                if placed[p.name][0] in ("xred", "final") and placed[q.name][0] != "final":
                    return None
                if not _passes_in_registers(p.store_index, placed[p.name][2], index, placed[q.name][2], ranges):
                    return None
        if self.max_buffers and len(self._io(a, b)) > self.max_buffers:
            return None
        if self._reaches(a, b, True) or self._reaches(b, a, True):
            return None
        return shape

    def _io(self, a, b) -> set:
        """The buffers the kernel of a+b would read or write in memory: what its members read from
        outside it, and what they write that a graph output or a node outside it reads (the
        arguments of the kernel, as ``_kernel`` finds them: ``reads`` and ``writes``)."""
        members = a.members + b.members
        written = {n.name for n in members}
        io = set()
        for n in members:
            for buf, _, _ in self.reads[id(n)]:
                if buf not in written:
                    io.add(buf)
            if n.name in self.outputs or any(
                    isinstance(c, ir.ExternNode) or self.group_of[id(c)] not in (a, b)
                    for c in self.consumers.get(n.name, ())):
                io.add(n.name)
        return io

    # -- fusion --------------------------------------------------------------------------------
    def fuse(self):
        self._fuse_rounds(self._candidates)
        # then tiny pointwise groups merge even without shared data: their launches cost far more
        # than their work (batch norm's num_batches_tracked += 1, one scalar kernel per layer
        # otherwise). Last, so that they never take a group from the kernel it shares data with.
        self._fuse_rounds(self._tiny_pairs)

    def _fuse_rounds(self, candidates):
        for _ in range(10):
            merged = False
            for _, a, b in candidates():
                if a not in self.live or b not in self.live or a is b:
                    continue
                shape = self.can_merge(a, b)
                if shape is None:
                    continue
                self._merge(a, b, shape)
                merged = True
            if not merged:
                break

    def _candidates(self):
        by_buf = {}
        for grp in self.groups:
            if grp.extern:
                continue
            for n in grp.members:
                for b in set(_writes(n)) | {r[0] for r in self.reads[id(n)]}:
                    by_buf.setdefault(b, set()).add(grp)
        scores = {}
        for buf, grps in by_buf.items():
            grps = sorted(grps, key=lambda g: g.order)
            nbytes = self.sv.hint(self.layouts[buf].nbytes) if buf in self.layouts else 0
            prod_grp = self.group_of.get(id(self.producer[buf])) if buf in self.producer else None
            for i, a in enumerate(grps):
                for b in grps[i + 1:i + 65]:  # a window, like Inductor, to bound the pair count
                    vertical = a is prod_grp or b is prod_grp
                    key = (id(a), id(b))
                    old = scores.get(key, (0, 0, a, b))
                    scores[key] = (old[0] + int(vertical), old[1] + nbytes, a, b)
        ranked = sorted(scores.values(), key=lambda s: (-s[0], -s[1], abs(s[2].order - s[3].order)))
        return [(s[:2], s[2], s[3]) for s in ranked]

    def _tiny_pairs(self):
        tiny = [g for g in self.groups if not g.extern and not g.reduced and _static(g.ranges)
                and math.prod(g.ranges) <= TINY_NUMEL]
        small = {}  # second stages by iteration space (only equal spaces merge: one config fits both)
        for g in self.groups:
            if not g.extern and g.reduced and not g.single and _static(g.ranges) \
                    and math.prod(g.ranges) <= SMALL_REDUCTION_NUMEL and self._second_stage(g):
                small.setdefault((g.ranges, g.reduced), []).append(g)
        pairs = [((0, 0), a, b) for i, a in enumerate(tiny) for b in tiny[i + 1:i + 65]]
        for same in small.values():
            same.sort(key=lambda g: g.order)
            pairs += [((0, 0), a, b) for i, a in enumerate(same) for b in same[i + 1:i + 65]]
        return pairs

    def _second_stage(self, g) -> bool:
        """Does every node of g reduce values that reductions computed (the final kernel of a split
        reduction reads only its partials)? Other small reductions keep their own kernels: merged
        across a model's layers they would tie kernels that a per-block compile (regional) keeps
        apart."""
        for n in g.members:
            if not n.is_reduction:
                return False
            for buf, _, _ in self.reads[id(n)]:
                p = self.producer.get(buf)
                if not (isinstance(p, ir.ComputedNode) and p.is_reduction):
                    return False
        return True

    def _merge(self, a, b, shape):
        self._rerank(a, b)
        a.members = sorted(a.members + b.members, key=lambda n: self.pos[id(n)])
        a.ranges, a.reduced, a.single = shape
        a.order = min(a.order, b.order)
        for n in b.members:
            self.group_of[id(n)] = a
        self.groups.remove(b)
        self.live.discard(b)
        self._succ_cache.pop(id(a), None)
        self._merges += 1

    def _rerank(self, a, b):
        """Keep ``rank`` a topological order when ``b`` is merged into ``a`` (before the merge).

        With ``lo``/``hi`` the earlier/later of the two, a legal merge has no path of length >= 2
        between them (``can_merge``), so the groups ranked between them that ``lo`` reaches (D) and
        those that reach ``hi`` are disjoint. Order of that span afterwards: the groups not in D (in
        their old order), the merged group, then D (in its old order): every edge still points
        forward (an edge out of D ends in D or after ``hi``; ``hi``'s predecessors in the span are
        not in D). Costs the span's length, which fusion keeps short (neighbouring groups)."""
        lo, hi = (a, b) if a.rank < b.rank else (b, a)
        limit = hi.rank
        below = set()
        stack = [g for g in self._succ(lo) if g.rank < limit]
        while stack:
            g = stack.pop()
            if g in below:
                continue
            below.add(g)
            stack.extend(h for h in self._succ(g) if h.rank < limit)
        span = [g for g in self.by_rank[lo.rank:limit + 1] if g is not None]
        slots = [g.rank for g in span]
        order = [g for g in span if g is not lo and g is not hi and g not in below] + [a] \
            + [g for g in span if g in below]
        for g, r in zip(order, slots):
            g.rank = r
            self.by_rank[r] = g
        self.by_rank[slots[-1]] = None
        b.rank = -1

    # -- result --------------------------------------------------------------------------------
    def _toposort(self):
        indeg = {id(g): 0 for g in self.groups}
        succ = {id(g): self._succ(g) for g in self.groups}
        for g in self.groups:
            for s in succ[id(g)]:
                indeg[id(s)] += 1
        ready = sorted((g for g in self.groups if indeg[id(g)] == 0), key=lambda g: g.order)
        out = []
        while ready:
            g = ready.pop(0)
            out.append(g)
            for s in succ[id(g)]:
                indeg[id(s)] -= 1
                if indeg[id(s)] == 0:
                    ready.append(s)
            ready.sort(key=lambda g: g.order)
        assert len(out) == len(self.groups), "cycle in the fused graph"
        return out

    def schedule(self) -> Schedule:
        if self.fusion:
            self.fuse()
        steps = []
        for k, grp in enumerate(self._toposort()):
            if grp.extern:
                steps.append(grp.members[0])
                continue
            steps.append(self._kernel(grp, k))
        last_use = {}
        for i, s in enumerate(steps):
            reads = s.reads if isinstance(s, Kernel) else [a.name for a in ir.buffer_args((s.args, s.kwargs))]
            for b in reads:
                last_use[b] = i
        report = self._report(steps)
        return Schedule(self.g, steps, last_use, self.outputs, report)

    def _kernel(self, grp, k) -> Kernel:
        ranges, reduced, single = grp.ranges, grp.reduced, grp.single
        roles, bodies, stores = {}, {}, {}
        names = {n.name for n in grp.members}
        for n in grp.members:
            role, mapping = place(n, ranges, reduced, single)
            roles[n.name] = role
            bodies[n.name] = ir.rename(n.body, mapping) if mapping else n.body
            stores[n.name] = sympy.sympify(n.store_index).xreplace(mapping)
            if _reshaped(mapping):  # fold the div/mod of reshape_map where the ranges allow
                known = dict(zip(ir.node_vars(len(ranges)), ranges))
                bodies[n.name] = ir.simplify_expr(bodies[n.name], known)
                stores[n.name] = ir.simplify_index(stores[n.name], known)
        local = {n.name for n in grp.members
                 if n.name not in self.outputs
                 and all(c.name in names for c in self.consumers.get(n.name, ()) if isinstance(c, ir.ComputedNode))
                 and not any(isinstance(c, ir.ExternNode) for c in self.consumers.get(n.name, ()))}
        ranges, reduced, bodies, stores = merge_loops(ranges, reduced, bodies, stores)
        kern = Kernel(f"k{k}", list(grp.members), ranges, reduced, roles, bodies, stores, local, single)
        reads = []
        for n in grp.members:
            for buf, _, _ in self.reads[id(n)]:
                if buf not in names and buf not in reads:
                    reads.append(buf)
        kern.reads = reads
        kern.writes = [n.name for n in grp.members if n.name not in local]
        # with symbolic sizes, bytes moved are counted at the hints
        kern.bytes_read = sum(self.sv.hint(self.layouts[b].nbytes) for b in reads)
        kern.bytes_written = sum(self.sv.hint(self.layouts[b].nbytes) for b in kern.writes)
        return kern

    def _report(self, steps):
        kernels = [s for s in steps if isinstance(s, Kernel)]
        externs = [s for s in steps if isinstance(s, ir.ExternNode)]
        ext_bytes = 0
        for e in externs:
            for a in ir.buffer_args((e.args, e.kwargs)):
                itemsize = self.layouts[a.name].dtype.itemsize
                hint = self.sv.hint
                ext_bytes += min(hint(math.prod(a.sizes)), hint(self.layouts[a.name].numel)) * itemsize
            ext_bytes += sum(self.sv.hint(o[1].nbytes) for o in e.outputs if o is not None and o[1] is not None)
        kb = sum(k.bytes_read + k.bytes_written for k in kernels)
        return {
            "kernels": len(kernels),
            "externs": len(externs),
            "extern_ops": [str(e.target) for e in externs],
            "kernel_bytes": kb,
            "extern_bytes": ext_bytes,
            "bytes": kb + ext_bytes,
            "per_kernel": [(k.name, [n.name for n in k.nodes], k.bytes_read, k.bytes_written) for k in kernels],
        }


def _index_exprs(bodies, stores):
    out = list(stores.values())
    for b in bodies.values():
        for e in ir.walk([b]):
            if e.op == "load":
                out.append(e.attr[1])
            elif e.op == "index":
                out.append(e.attr)
    return out


def _mergeable(exprs, vp, vq, nq) -> bool:
    """True if every index uses v_p and v_q only as ``c*nq*v_p + c*v_q`` (so one variable over
    their flattened range can replace both). ``c`` and ``nq`` may be expressions of sizes."""
    return all(_mergeable_index(e, vp, vq, nq) for e in exprs)


@functools.lru_cache(maxsize=65536)
def _mergeable_index(e, vp, vq, nq) -> bool:
    """``_mergeable`` for one index, cached: every layer's kernels ask about the same indices."""
    e = sympy.expand(e)
    cp, cq = e.coeff(vp), e.coeff(vq)
    if cp.is_Integer and cq.is_Integer:
        if cp != cq * nq:
            return False
    elif not (ir.size_symbols_of(cp) == cp.free_symbols and ir.size_symbols_of(cq) == cq.free_symbols
              and sympy.expand(cp - cq * nq) == 0):
        return False
    rest = e - cp * vp - cq * vq
    return not (vp in rest.free_symbols or vq in rest.free_symbols)


def merge_loops(ranges, reduced, bodies, stores, merge_kept=True):
    """Merge adjacent loops (both kept or both reduced) that every index walks contiguously,
    e.g. ``7*v0 + v1`` over [10, 7] becomes ``v0`` over [70]: less index math per element.
    ``merge_kept=False`` merges only reduced loops (the kept ones must stay as other nodes see them)."""
    ranges, reduced = list(ranges), list(reduced)
    changed = True
    while changed:
        changed = False
        exprs = _index_exprs(bodies, stores)
        kept_pos = [i for i in range(len(ranges)) if i not in reduced]
        for group in (kept_pos, reduced) if merge_kept else (reduced,):
            for p, q in zip(group, group[1:]):
                vs = ir.node_vars(len(ranges))
                if not _mergeable(exprs, vs[p], vs[q], ranges[q]):
                    continue
                # v_q takes the merged range; v_p disappears; later vars shift down by one
                tmp = {vs[i]: ir.sym(f"_m{i}") for i in range(len(ranges))}
                new_ranges = ranges[:p] + ranges[p + 1:]
                qi = q - (1 if q > p else 0)
                new_ranges[qi] = ir.as_int_or_expr(ranges[p] * ranges[q])
                final = {}
                for i in range(len(ranges)):
                    if i == p:
                        continue
                    final[tmp[vs[i]]] = ir.sym(f"v{i - (1 if i > p else 0)}")
                sub1 = {vs[p]: sympy.Integer(0), vs[q]: tmp[vs[q]], **{vs[i]: tmp[vs[i]] for i in range(len(ranges)) if i not in (p, q)}}
                memo1, memo2 = {}, {}
                bodies = {k: ir.rename(ir.rename(b, sub1, memo1), final, memo2) for k, b in bodies.items()}
                stores = {k: sympy.sympify(v).xreplace(sub1).xreplace(final) for k, v in stores.items()}
                reduced = [r - (1 if r > p else 0) for r in reduced if r != p]
                ranges = new_ranges
                changed = True
                break
            if changed:
                break
    return tuple(ranges), tuple(reduced), bodies, stores


def _leaves(tree):
    if isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _leaves(t)
    else:
        yield tree


def schedule(g: ir.GraphIR, options: NativeOptions | None = None) -> Schedule:
    return Scheduler(g, options).schedule()
