"""Split reductions: a reduction with few outputs and a long reduced range becomes two nodes.

Unsplit, such a reduction runs a handful of programs that each loop over the whole range while the
rest of the GPU idles (BatchNorm statistics of a ResNet: 64 channels, each a sum over N*H*W = 800k
elements, ran as 4 programs). Split, the first node reduces S chunks of the range into an
``[S, outputs]`` buffer of partial results (in the accumulation dtype), with S chosen so the first
kernel runs ``split_reduction_programs`` programs or more; the second reduces the S partials of each
output. The second node keeps the original node's name and layout, so its readers do not change.

sum, prod, max, min, any and all combine partial results with the same operation. argmax/argmin are
not split (a position within a chunk is not a position within the range).

var_mean is lowered as two sums, ``A = sum(x)`` and ``B = sum((x - A / n) ** 2)`` (lower_ops._var_mean;
``variance_pairs`` finds such pairs); the renderers compute a pair in one pass over x (Welford in
looped kernels: triton_welford, cpp_reduce; a persistent Triton kernel keeps the row in registers). For
Triton kernels a pair splits as one (``split_pair``): the partial kernel computes both over each
chunk of c elements, one pass: ``A_i = sum(x - k)`` and ``B_i = sum((x - k - A_i / c) ** 2)``, where
the shift k is x at the first reduced position of the output (so fp32 partial means of data far from
zero, 1e4 + randn, keep their digits); the final kernel merges the chunks' (count, mean, M2) as Chan
et al.'s parallel Welford does: ``S = sum(A_i)``, ``B = sum(B_i + c * (A_i / c - S / n) ** 2)``, and
``A = S + n * k`` (a pointwise node of A's name). Chunks are equal (a pair splits only where the count
divides the range). Split apart instead, B's partial kernel would need A's final value: x read twice.

The split is made along the outermost reduced loop (after merging the reduced loops that are
contiguous in memory, so for a channels-last tensor all of N*H*W is one loop). Chunks are a divisor
of that loop's size when one is near the wanted count; otherwise the last chunk's tail is masked.

Strided ("outer") reductions in Triton kernels (BatchNorm statistics and weight gradients of a
channels-last activation: per channel, a sum down N*H*W rows of C contiguous values; the weight and
bias gradients of LayerNorm and RMSNorm: per column, a sum down the rows; ``contiguous_reduction``
tells them from row reductions) are bound by
how many bytes are in flight, not by per-program loop overhead: they split into many short chunks
(``split_outer_outputs`` partial outputs, chunks of ``split_outer_rows`` rows or more), so the
partial kernel runs ~1000 programs of 64 channels each (triton_emit.OUTER_CONFIGS). On an H100 at
ResNet-50's shapes (benchmarks/results/outer_reduction-nvidia-h100-s36.json) anything from ~400 to
~1600 such programs of 256-1024 rows ran within 5% of the best; the old rule (programs of 16
channels, chunks of 4096-8192 rows, the unsplit 7x7 layer) was 10-95% slower.
The C++ renderer keeps the rule above (its kernels parallelize over outputs with few threads).
"""
from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from ember.native import ir
from ember.native.scheduler import merge_loops
from ember.native.options import NativeOptions

SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")
# Programs of a reduction whose reduced loop is strided, not contiguous: each covers this many
# outputs along the contiguous kept dim (the C++ renderer's rule; Triton's: split_outer_*).
STRIDED_XBLOCK = 16
# Triton's rule for strided reductions: the x block of their partial kernels
# (triton_emit.OUTER_CONFIGS), and chunks of a multiple of ALIGN_ROWS rows where a divisor allows
# (the r-loop's blocks then need no mask)
OUTER_XBLOCK = 64
ALIGN_ROWS = 32


def identity(rtype: str, dtype: torch.dtype):
    """The value that leaves a reduction unchanged (fills the masked tail of the last chunk)."""
    if rtype in ("sum", "any") or dtype == torch.bool and rtype == "max":
        return 0
    if rtype in ("prod", "all") or dtype == torch.bool and rtype == "min":
        return 1
    if dtype.is_floating_point:
        return -math.inf if rtype == "max" else math.inf
    info = torch.iinfo(dtype)
    return info.min if rtype == "max" else info.max


def contiguous_reduction(body: ir.Expr, last_var, sizes: dict | None = None) -> bool:
    """Does the innermost reduced loop walk memory contiguously (an "inner" reduction, reduced
    along rows)? Every load that depends on it votes (stride 1 along it: contiguous; else strided),
    weighted by how many elements it touches: the product of ``sizes`` (loop variable -> size, 1
    where absent) over the loop variables in its index. So the big operands decide, not a vector
    beside them: an RMSNorm weight gradient, per column a sum down the rows of ``g[r, c] * x[r, c] *
    rstd[r]``, reads ``rstd`` with stride 1 along r, and judged by it (session 37's rule: the first
    load met) the column sum ran unsplit as one program per column, every load strided (0.70 ms per
    launch on an H100 at Llama-1.1B's 4096 x 2048). A tie is contiguous; True when no load depends
    on the loop."""
    sizes = sizes or {}
    votes = 0  # elements read contiguously along the loop minus those read with a stride
    met = False
    for ld in ir.loads_of(body):
        index = sympy.expand(ld.attr[1])
        if last_var not in index.free_symbols:
            continue
        met = True
        weight = math.prod(sizes.get(v, 1) for v in index.free_symbols)
        votes += weight if index.coeff(last_var) == 1 else -weight
    return not met or votes >= 0


def split_count(n: ir.ComputedNode, ranges, reduced, body, options, outer_rule: bool = False) -> int:
    """How many chunks to split n's outermost reduced loop into (1: leave n whole); ``outer_rule``:
    strided reductions take the rule of Triton kernels (module docstring)."""
    if n.reduction_type not in SPLITTABLE:
        return 1
    if not all(isinstance(r, int) for r in n.ranges):
        return 1  # symbolic sizes: how many programs a reduction runs is only known per call
    rnumel = math.prod(ranges[i] for i in reduced)
    xnumel = math.prod(r for i, r in enumerate(ranges) if i not in reduced)
    if xnumel * rnumel <= options.single_program_numel:
        return 1  # the scheduler may run it as one program, in one launch
    size = ranges[reduced[0]]
    vs = ir.node_vars(len(ranges))
    strided = not contiguous_reduction(body, vs[reduced[-1]], dict(zip(vs, ranges)))
    outer = strided and outer_rule
    per_program = min(xnumel, (OUTER_XBLOCK if outer else STRIDED_XBLOCK) if strided else 1)
    programs = -(-xnumel // per_program)
    target = options.split_reduction_programs
    if programs >= target or per_program * rnumel < options.split_reduction_numel:
        return 1  # enough programs, or each one's loop is short anyway
    if outer:
        # enough partial outputs to fill the GPU, in chunks no shorter than split_outer_rows
        most = size // options.split_outer_rows
        want = min(-(-options.split_outer_outputs // xnumel), most)
        return 1 if want < 2 else _aligned_divisor(size, want, most)
    return _near_divisor(size, max(2, min(-(-target // programs), size // 2)))


def _aligned_divisor(size: int, want: int, most: int) -> int:
    """A chunk count from want/2 to min(2*want, most) that divides size into chunks of a multiple of
    ALIGN_ROWS rows (the r-loop's blocks then need no mask), nearest to want; else _near_divisor's."""
    best = None
    for s in range(max(2, want // 2), min(2 * want, most) + 1):
        if size % s == 0 and (size // s) % ALIGN_ROWS == 0:
            key = abs(math.log(s / want))
            if best is None or key < best[0]:
                best = (key, s)
    return best[1] if best else _near_divisor(size, want)


def _near_divisor(size: int, want: int) -> int:
    """A chunk count from want to 2*want that divides size (no masked tail), else want's."""
    for s in range(want, min(2 * want, size // 2) + 1):
        if size % s == 0:
            return s
    chunk = -(-size // want)
    return -(-size // chunk)  # no empty chunk


def variance_pairs(sums: dict, rnumel) -> dict:
    """{A: B} for the lowering's var_mean pairs among ``sums`` (name -> body of a "sum" reduction, all
    over one loop nest whose reduced part has ``rnumel`` points): ``A = sum(x)`` and ``B = sum((x - A /
    rnumel) ** 2)`` in float32/float64 (lower_ops._var_mean). Both renderers compute such a pair in
    one Welford pass (cpp_reduce, triton_emit); ``split_pair`` splits one as a whole. (The caller
    checks that B reads A where A is stored.)"""
    pairs = {}
    for b, sq in sums.items():
        if sq.op != "mul" or sq.args[0] != sq.args[1] or sq.args[0].op != "sub":
            continue
        x, mean = sq.args[0].args
        if mean.op != "truediv" or mean.args[0].op != "load" or mean.args[0].args or mean.args[1].op != "const":
            continue
        a = mean.args[0].attr[0]
        if (a in sums and a != b and a not in pairs and sums[a] == x and mean.args[1].attr == rnumel
                and x.dtype == sq.dtype and sq.dtype in (torch.float32, torch.float64)
                and not any(ld.attr[0] == a for ld in ir.loads_of(x))):
            pairs[a] = b
    return pairs


def split_node(n: ir.ComputedNode, options, outer_rule: bool = False) -> list:
    """[n], or [partial, final] replacing it."""
    ranges, reduced, bodies, stores = merge_loops(n.ranges, n.reduced, {n.name: n.body},
                                                  {n.name: n.store_index}, merge_kept=False)
    body, store = bodies[n.name], sympy.sympify(stores[n.name])
    count = split_count(n, ranges, reduced, body, options, outer_rule)
    if count < 2:
        return [n]
    chunk = -(-ranges[reduced[0]] // count)
    if chunk < 2:
        return [n]
    return list(_split(n, ranges, reduced, body, store, count, chunk))


def _split(n, ranges, reduced, body, store, count, chunk):
    """(partial, final) of n over its merged loops, the outermost reduced one cut into count chunks."""
    p0 = reduced[0]
    size = ranges[p0]
    # partial: loops ranges[:p0] + [count, chunk] + ranges[p0+1:]; the split loop's old variable is
    # chunk index * chunk + position in the chunk
    vs, pv = ir.node_vars(len(ranges)), ir.node_vars(len(ranges) + 1)
    to_partial = {v: pv[i + (i > p0)] for i, v in enumerate(vs)}
    to_partial[vs[p0]] = pv[p0] * chunk + pv[p0 + 1]
    pbody = ir.rename(body, to_partial)
    if count * chunk != size:
        inside = ir.op("lt", ir.index_value(to_partial[vs[p0]]), ir.const(size, torch.int64))
        pbody = ir.masked(inside, pbody, identity(n.reduction_type, pbody.dtype))
    span = max(n.layout.storage_numel, 1)
    pstore = pv[p0] * span + store.xreplace(to_partial)
    playout = ir.Layout((count,) + tuple(n.layout.sizes), (span,) + tuple(n.layout.strides), pbody.dtype,
                        n.layout.device)
    pranges = tuple(ranges[:p0]) + (count, chunk) + tuple(ranges[p0 + 1:])
    preduced = tuple(r + (r >= p0) for r in reduced)
    partial = ir.ComputedNode(f"{n.name}_partial", playout, pranges, pbody, pstore, preduced,
                              n.reduction_type, origins=list(n.origins))
    # final: loops [count] + the kept loops; reduces the partials of each output
    kept = [i for i in range(len(ranges)) if i not in reduced]
    fv = ir.node_vars(len(kept) + 1)
    to_final = {vs[i]: fv[j + 1] for j, i in enumerate(kept)}
    fstore = store.xreplace(to_final)
    fbody = ir.load(partial.name, fv[0] * span + fstore, {}, pbody.dtype)
    final = ir.ComputedNode(n.name, n.layout, (count,) + tuple(ranges[i] for i in kept), fbody, fstore, (0,),
                            n.reduction_type, origins=list(n.origins))
    return partial, final


def graph_pairs(nodes) -> dict:
    """{A: B} over a graph's reductions (``variance_pairs``), B reading A where A is stored."""
    groups: dict = {}
    for n in nodes:
        if isinstance(n, ir.ComputedNode) and n.reduction_type == "sum" and all(isinstance(r, int) for r in n.ranges):
            groups.setdefault((tuple(n.ranges), tuple(n.reduced)), {})[n.name] = n
    out = {}
    for (ranges, reduced), members in groups.items():
        rnumel = math.prod(ranges[i] for i in reduced)
        for a, b in variance_pairs({k: v.body for k, v in members.items()}, rnumel).items():
            store = sympy.sympify(members[a].store_index)
            if all(sympy.expand(e.attr[1] - store) == 0 for e in ir.loads_of(members[b].body) if e.attr[0] == a):
                out[a] = b
    return out


def split_pair(a: ir.ComputedNode, b: ir.ComputedNode, options) -> list | None:
    """[A_partial, B_partial, A_shifted, A, B] for a var_mean pair (module docstring), or None where
    the pair does not split, or its chunks would be unequal (then each node splits on its own)."""
    ranges, reduced, bodies, stores = merge_loops(a.ranges, a.reduced, {a.name: a.body, b.name: b.body},
                                                  {a.name: a.store_index, b.name: b.store_index}, merge_kept=False)
    count = split_count(a, ranges, reduced, bodies[a.name], options, True)
    size = ranges[reduced[0]]
    if count < 2 or size % count or size // count < 2:
        return None
    chunk = size // count
    n = math.prod(ranges[i] for i in reduced)
    c = n // count  # elements per chunk (the chunk's rows times the other reduced loops)
    x = bodies[a.name]
    dt = x.dtype
    # the shift k: x at the first reduced position of each output (the partial and final kernels read
    # it where they are; its row is read by every chunk, from cache)
    vs = ir.node_vars(len(ranges))
    k = ir.rename(x, {vs[i]: sympy.Integer(0) for i in reduced})
    shifted = ir.op("sub", x, k)
    pa, fs = _split(a, ranges, reduced, shifted, sympy.sympify(stores[a.name]), count, chunk)
    pb, fb = _split(b, ranges, reduced, shifted, sympy.sympify(stores[b.name]), count, chunk)
    # B_i: the squared deviations from the chunk's own mean (renderers: one Welford pass with A_i)
    d = ir.op("sub", pa.body, ir.op("truediv", ir.load(pa.name, pa.store_index, {}, dt), ir.const(c, dt)))
    pb.body = ir.op("mul", d, d)
    # the final kernel: S = sum(A_i) (of x - k), A = S + n k, B = sum(B_i + c (A_i / c - S / n)^2)
    # (fs.body reads A_i where the final kernel reads it)
    fs.name = f"{a.name}_shifted"
    fs.layout = dataclasses.replace(a.layout, dtype=dt)
    kept = [i for i in range(len(ranges)) if i not in reduced]
    fv = ir.node_vars(len(kept) + 1)
    to_out = {vs[i]: fv[j] for j, i in enumerate(kept)}  # (A is pointwise over the kept loops)
    total = ir.load(fs.name, sympy.sympify(stores[a.name]).xreplace(to_out), {}, dt)
    a_body = ir.cast(ir.op("add", total, ir.op("mul", ir.const(n, dt), ir.rename(k, to_out))), a.layout.dtype)
    fa = ir.ComputedNode(a.name, a.layout, tuple(ranges[i] for i in kept), a_body,
                         sympy.sympify(stores[a.name]).xreplace(to_out), origins=list(a.origins))
    e = ir.op("sub", ir.op("truediv", fs.body, ir.const(c, dt)),
              ir.op("truediv", ir.load(fs.name, fs.store_index, {}, dt), ir.const(n, dt)))
    fb.body = ir.op("add", fb.body, ir.op("mul", ir.const(c, dt), ir.op("mul", e, e)))
    return [pa, pb, fs, fa, fb]


def split_reductions(g: ir.GraphIR, options: NativeOptions, renderer: str = "triton") -> ir.GraphIR:
    """Split, in place, every reduction of g that would run too few programs for its size
    (``renderer``: "triton" or "cpp", whose kernels the graph becomes). var_mean pairs split as one
    for Triton kernels (``split_pair``); the C++ renderer's few long chunks split them apart."""
    nodes = []
    outer_rule = renderer == "triton"
    pairs = graph_pairs(g.nodes) if outer_rule else {}
    by_name = {n.name: n for n in g.nodes if isinstance(n, ir.ComputedNode)}
    done = set()
    for n in g.nodes:
        if not (isinstance(n, ir.ComputedNode) and n.is_reduction):
            nodes.append(n)
        elif n.name in done:
            continue
        elif n.name in pairs and (both := split_pair(n, by_name[pairs[n.name]], options)) is not None:
            nodes += both  # (B reads only what A reads, and A: its place is right after A's)
            done.add(pairs[n.name])
        else:
            nodes += split_node(n, options, outer_rule)
    g.nodes = nodes
    return g
