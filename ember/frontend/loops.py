"""Graph breaks inside loops: the loop runs as Python, its body as compiled *segments*.

A break inside a ``for`` / ``while`` body would otherwise leave the whole loop to Python (or, in
torch.compile, the whole function). Here the break function of such a break is a **driver**: a copy of
the original code whose loop control (the iterable, ``GET_ITER``, ``FOR_ITER``, a ``while`` head) runs
natively, as in the original, while every place where native control enters the body calls a compiled
**segment**::

    driver (bytecode copy)                     segment (compiled, one FrameCache each)
      for ... in <iterable>:  # native           traces the body from its entry until it reaches a
          r = seg_body(stack, locals())   ───►   *stop*: a loop control, a user ``try`` body, or a
          restore locals / stack from r   ◄───   way out of the loop; returns (stop, stack, locals)
          jump to stop r[0]                      or (RETURN, (value,), None) for a ``return``

A break met while tracing a segment becomes a *statement region*: the whole statement around the
unsupported instruction runs natively (so the Python values it makes or reads - an ``.item()``, an
f-string - never become guarded constants of the next segment) and each way out continues in another
segment of the same loop, or hands the stop back. A break inside a loop nested in the body that the
driver does not drive yet makes that loop a nested driver. Every continuation made inside a loop is
*scoped*: when it runs natively (a region, or a segment that fell back to eager) it never crosses a
stop - each arrival there returns ``(stop, stack, locals)`` - and each ``return`` is tagged. So the
iterator stays the real Python object in the driver's frame, and the per-iteration compiled work is
the straight-line code between the breaks.

Exceptions: the driver's calls sit at their original positions, inside the original exception table,
so an exception raised in a segment reaches the handlers around the loop exactly once; scoped copies
drop the handlers outside their loop. User ``try`` bodies inside the loop run natively in the driver
(compiled code there would skip their handlers).

This module holds the static analysis (loops, statements, scopes) and the driver's bytecode; resume.py
builds the copies and breaks.py owns the caches.
"""
from __future__ import annotations

import builtins
import types
from dataclasses import dataclass, field
from functools import lru_cache

import bytecode as bclib

from ember.frontend import bytecode as bc

RETURN = -1  # the stop of a scoped continuation that returned: (RETURN, (value,), None)

_UNCONDITIONAL = {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT"}
_TERMINAL = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"}
# an instruction that completes a statement: a region may start right after one
_STATEMENT_END = {"STORE_FAST", "STORE_DEREF", "STORE_GLOBAL", "STORE_NAME", "STORE_ATTR", "STORE_SUBSCR",
                  "STORE_SLICE", "DELETE_FAST", "DELETE_DEREF", "DELETE_GLOBAL", "DELETE_NAME", "DELETE_ATTR",
                  "DELETE_SUBSCR", "POP_TOP", "NOP", "RESUME", "POP_EXCEPT", "END_FOR", "PRINT_EXPR",
                  "STORE_FAST_STORE_FAST"}  # 3.13 (not STORE_FAST_LOAD_FAST: it also starts the next statement)


class LoopUnsupported(Exception):
    """This loop cannot be driven (the caller falls back to running it as plain Python)."""


def _call(n: int) -> list:
    return ([bclib.Instr("PRECALL", n)] if bc.PY < (3, 12) else []) + [bclib.Instr("CALL", n)]


def null_and(*load) -> list:
    """A callable for CALL without ``self``: [NULL, callable] up to 3.12, [callable, NULL] on 3.13."""
    if bc.PY >= (3, 13):
        return [*load, bclib.Instr("PUSH_NULL")]
    return [bclib.Instr("PUSH_NULL"), *load]


def callable_under_tos(*load) -> list:
    """[.., x] -> [.., callable and its NULL (in the running version's order), x]: ready for CALL 1."""
    if bc.PY >= (3, 13):
        return [*load, bclib.Instr("SWAP", 2), bclib.Instr("PUSH_NULL"), bclib.Instr("SWAP", 2)]
    return [bclib.Instr("PUSH_NULL"), bclib.Instr("SWAP", 2), *load, bclib.Instr("SWAP", 2)]


def _pop_jump(if_true: bool, label) -> bclib.Instr:
    name = ("POP_JUMP_IF_TRUE" if if_true else "POP_JUMP_IF_FALSE") if bc.PY >= (3, 12) else \
        ("POP_JUMP_FORWARD_IF_TRUE" if if_true else "POP_JUMP_FORWARD_IF_FALSE")
    return bclib.Instr(name, label)


# ---- static analysis ---------------------------------------------------------------------------
def _successors(ins, instrs) -> list:
    """Normal-flow successors (no exception edges) of one decoded instruction."""
    out = []
    if ins.target is not None:
        out.append(ins.target)
        if ins.opname == "FOR_ITER" and bc.PY >= (3, 12):
            out.append(ins.target + bc.FOR_ITER_SKIP)  # an exhausted 3.12+ FOR_ITER lands past its END_FOR
    if ins.opname not in _UNCONDITIONAL | _TERMINAL and ins.index + 1 < len(instrs):
        out.append(ins.index + 1)
    return out


@lru_cache(maxsize=1024)
def normal_reachable(code: types.CodeType) -> frozenset:
    """Instructions reachable from the start without an exception: handler-only code is not."""
    instrs = bc.decode(code)
    seen, work = set(), [0]
    while work:
        k = work.pop()
        if k in seen or k >= len(instrs):
            continue
        seen.add(k)
        work.extend(_successors(instrs[k], instrs))
    return frozenset(seen)


@lru_cache(maxsize=1024)
def jump_targets(code: types.CodeType) -> frozenset:
    instrs = bc.decode(code)
    out = {i.target for i in instrs if i.target is not None}
    index_of = {i.offset: i.index for i in instrs}
    out |= {index_of[e.target] for e in bc.exception_entries(code) if e.target in index_of}
    return frozenset(out)


@dataclass(frozen=True)
class Loop:
    kind: str                # "for" | "while"
    entry: int               # where native control starts the loop: a for loop's iterable statement
    heads: tuple             # where each iteration starts: the FOR_ITER, or a while loop's back-edge targets
    first: int               # the loop's own instructions: [first, last] (for: from FOR_ITER)
    last: int
    exit: int | None = None  # for: where an exhausted FOR_ITER continues

    def contains(self, index: int) -> bool:
        return self.first <= index <= self.last

    @property
    def controls(self) -> frozenset:
        """What a driver runs natively to drive this loop (a segment stops there)."""
        return frozenset({self.entry, *self.heads})

    @property
    def body_entries(self) -> tuple:
        """Where native control enters the body (the driver calls a segment there)."""
        return (self.heads[0] + 1,) if self.kind == "for" else self.heads


@lru_cache(maxsize=1024)
def find_loops(code: types.CodeType) -> tuple:
    """The loops of ``code``, outermost first (by start). For loops come from FOR_ITER; while loops
    from the backward jumps of normal flow (3.12 moves handlers after the function body and jumps
    back from there: those are not loops), grouped by target and merged where they overlap without
    nesting (a 3.11 ``continue`` jumps to the loop's first condition, the bottom test to the body)."""
    instrs = bc.decode(code)
    reach = normal_reachable(code)
    out = []
    for_heads = set()
    for ins in instrs:
        if ins.opname != "FOR_ITER" or ins.index not in reach:
            continue
        for_heads.add(ins.index)
        if bc.PY >= (3, 12):
            # END_FOR (3.13: and its POP_TOP) belongs to the loop
            last, exit_ = ins.target + bc.FOR_ITER_SKIP - 1, ins.target + bc.FOR_ITER_SKIP
        else:
            last, exit_ = ins.target - 1, ins.target
        entry = ins.index
        if entry > 0 and instrs[entry - 1].opname == "GET_ITER":
            entry = statement_start(code, entry - 1, 0)
        out.append(Loop("for", entry, (ins.index,), ins.index, last, exit_))
    groups: dict = {}
    for ins in instrs:
        if ins.index in reach and ins.target is not None and ins.target < ins.index and ins.target not in for_heads:
            groups[ins.target] = max(groups.get(ins.target, ins.index), ins.index)
    spans = [[lo, hi, {lo}] for lo, hi in sorted(groups.items())]
    merged = True
    while merged:
        merged = False
        for a in spans:
            for b in spans:
                if a is not b and a[0] < b[0] <= a[1] < b[1]:  # overlap, neither inside the other
                    a[1], a[2] = b[1], a[2] | b[2]
                    spans.remove(b)
                    merged = True
                    break
            if merged:
                break
    for lo, hi, heads in spans:
        out.append(Loop("while", lo, tuple(sorted(heads)), lo, hi))
    for a in out:  # loops must nest: anything else is a layout this module does not model
        for b in out:
            if a is not b and a.first < b.first <= a.last < b.last:
                raise LoopUnsupported(f"loops at instructions {a.first} and {b.first} overlap without nesting")
    return tuple(sorted(out, key=lambda lp: (lp.first, -lp.last)))


def loops_around(code: types.CodeType, index: int) -> list:
    """The loops whose own instructions contain ``index``, outermost first."""
    return [lp for lp in find_loops(code) if lp.contains(index)]


def statement_start(code: types.CodeType, index: int, floor: int) -> int:
    """The first instruction of the straight-line statement that ``index`` belongs to (not before
    ``floor``): back over instructions that complete no statement, stopping at jumps and targets."""
    instrs = bc.decode(code)
    targets = jump_targets(code)
    k = index
    while k > floor and k not in targets:
        prev = instrs[k - 1]
        if prev.opname in _STATEMENT_END or prev.target is not None or prev.opname in _TERMINAL:
            break
        k -= 1
    return k


def statement_end(code: types.CodeType, index: int, stops) -> int:
    """The last instruction of the statement ``index`` belongs to: forward to the instruction that
    completes it (a store, a POP_TOP, a jump - its targets are then the region's exits), never onto
    a stop."""
    instrs = bc.decode(code)
    e = index
    while True:
        ins = instrs[e]
        if ins.opname in _STATEMENT_END or ins.target is not None or ins.opname in _TERMINAL:
            return e
        if e + 1 >= len(instrs) or (e + 1) in stops:
            return e
        e += 1


# ---- scopes ------------------------------------------------------------------------------------
def _handler_blocks(code: types.CodeType, lo: int, hi: int) -> set:
    """Handler-only code of the try / with statements inside [lo, hi] (3.12 places it after the
    function body): it belongs to the loop."""
    instrs = bc.decode(code)
    reach = normal_reachable(code)
    index_of = {i.offset: i.index for i in instrs}
    entries = [(index_of.get(e.start), index_of.get(e.target)) for e in bc.exception_entries(code)]
    found: set = set()
    work = [t for s, t in entries if s is not None and t is not None and lo <= s <= hi]
    while work:
        k = work.pop()
        if k in found or k in reach or lo <= k <= hi or k >= len(instrs):
            continue
        found.add(k)
        work.extend(_successors(instrs[k], instrs))
        work.extend(t for s, t in entries if s == k and t is not None)
    return found


def _user_try_handler(code: types.CodeType, entry) -> bool:
    instrs = bc.decode(code)
    h = next((i.index for i in instrs if i.offset == entry.target), None)
    return h is not None and not any(i.opname == "WITH_EXCEPT_START" for i in instrs[h:h + 3])


@dataclass(frozen=True, eq=False)
class Scope:
    """The loops one driver runs natively, and where its compiled segments stop."""

    code: types.CodeType
    loops: tuple              # the driven loops, outermost first (each nested in the one before)
    inside: frozenset         # the outermost driven loop's instructions and its handler code
    controls: frozenset       # loop control the driver runs natively
    protected: frozenset      # inside a user try body whose handler is in the loop: native only
    dispatch: frozenset       # the stops inside the loop the driver can jump to
    parent: "Scope | None" = None
    key: tuple = field(default=())

    def stops_trace(self, index: int) -> bool:
        """Does a compiled segment stop before ``index``?"""
        return index in self.controls or index in self.protected or index not in self.inside

    def stops_copy(self, index: int) -> bool:
        """Does a native scoped copy hand back before ``index`` (it may run through try bodies)?"""
        return index in self.controls or index not in self.inside

    def iterator_floor(self, index: int) -> int:
        """Stack slots below this, at ``index``, belong to the driver (its iterators, the with-blocks
        around the loop): a segment passes them through untouched."""
        depths = _depths(self.code)
        floor = 0
        s = self
        while s is not None:
            for lp in s.loops:
                if lp.kind == "for" and lp.heads[0] < index <= lp.last:
                    floor = max(floor, depths[lp.heads[0]])
                elif lp.kind == "while" and lp.contains(index):
                    floor = max(floor, min(depths[h] for h in lp.heads))
            s = s.parent
        return floor

    def describe(self) -> str:
        instrs = bc.decode(self.code)
        outer = self.loops[0]
        return f"{outer.kind} loop at line {instrs[outer.heads[0]].lineno}"


def _depths(code):
    from ember.frontend.resume import stack_depths  # resume.py builds on this module

    return stack_depths(code)


_SCOPES: dict = {}


def make_scope(code: types.CodeType, driven: list, parent: "Scope | None") -> Scope:
    """The scope of a driver for ``driven`` (nested loops, outermost first), inside ``parent``."""
    key = (id(code), tuple((lp.first, lp.last) for lp in driven), parent.key if parent is not None else None)
    hit = _SCOPES.get(key)
    if hit is not None and hit.code is code:
        return hit
    outer = driven[0]
    inside = frozenset(range(outer.first, outer.last + 1)) | frozenset(_handler_blocks(code, outer.first, outer.last))
    instrs = bc.decode(code)
    index_of = {i.offset: i.index for i in instrs}
    protected: set = set()
    starts: set = set()
    for e in bc.exception_entries(code):
        h = index_of.get(e.target)
        if h is None or h not in inside or not _user_try_handler(code, e):
            continue
        covered = [i.index for i in instrs if e.start <= i.offset < e.end]
        protected.update(covered)
        if covered:
            starts.add(covered[0])
    controls = frozenset().union(*(lp.controls for lp in driven))
    targets = jump_targets(code)
    dispatch = controls | {i for i in protected if i in starts or i in targets or (i - 1) not in protected}
    scope = Scope(code, tuple(driven), inside, controls, frozenset(protected), frozenset(dispatch), parent, key)
    _SCOPES[key] = scope
    return scope


def driven_loops(code: types.CodeType, failing: int, scope: "Scope | None") -> list:
    """The loops a break at ``failing`` makes a driver for: those around it that ``scope`` does not
    drive already (outermost first); empty when the break is straight-line code of its scope."""
    around = loops_around(code, failing)
    for lp in around:
        if inlined_comprehension(code, lp):
            raise LoopUnsupported(f"the loop at instruction {lp.first} is an inlined comprehension")
    if scope is not None:
        driven = set()
        s = scope
        while s is not None:
            driven |= {(lp.first, lp.last) for lp in s.loops}
            s = s.parent
        around = [lp for lp in around if (lp.first, lp.last) not in driven and lp.first in scope.inside]
    return around


def inlined_comprehension(code: types.CodeType, lp: Loop) -> bool:
    """3.12+ runs comprehensions inside their function's frame (PEP 709): the loop keeps the result
    being built and the saved iteration variable (LOAD_FAST_AND_CLEAR) on the stack under the
    iterator. A driver built around such a loop crashed CPython 3.12 (SIGSEGV), so these loops are
    not driven: the whole loop runs as Python, as before drivers existed."""
    if bc.PY < (3, 12) or lp.kind != "for":
        return False
    instrs = bc.decode(code)  # the prologue: LOAD_FAST_AND_CLEAR var; SWAP 2; BUILD_LIST 0; SWAP 2; FOR_ITER
    return any(instrs[k].opname == "LOAD_FAST_AND_CLEAR" for k in range(max(0, lp.first - 6), lp.first))


# ---- the driver's bytecode ---------------------------------------------------------------------
def segment_call(depth: int, segment, then: list) -> list:
    """At a body entry with ``depth`` stack values: ``r = segment(stack copy, locals())`` with the
    stack left in place (a handler around the loop expects it if the segment raises), then ``then``."""
    out = [bclib.Instr("COPY", depth) for _ in range(depth)]
    out += [bclib.Instr("BUILD_TUPLE", depth), *callable_under_tos(bclib.Instr("LOAD_CONST", segment)),
            *null_and(bclib.Instr("LOAD_CONST", builtins.locals)), *_call(0), *_call(2)]
    return out + then


def drop_stack(label, depth: int, dispatch) -> list:
    """[stack (depth values), r] -> [r], then the shared dispatch."""
    out = [label]
    for _ in range(depth):
        out += [bclib.Instr("SWAP", 2), bclib.Instr("POP_TOP")]
    return out + [bclib.Instr("JUMP_FORWARD", dispatch)]


def written_in_loop(code: types.CodeType, scope: Scope) -> frozenset:
    """The fast locals the driven loop stores or deletes (its loop variables among them)."""
    return frozenset(n for k, i in enumerate(bc.decode(code)) if k in scope.inside for n in bc.fast_locals_written(i))


def _restored_names(code: types.CodeType, scope: Scope) -> list:
    """The locals a driver takes back from a segment: only what the loop can change (the fast
    locals it stores or deletes) and every cell."""
    cells = set(code.co_cellvars)
    stored = written_in_loop(code, scope)
    return [n for n in code.co_varnames if n in stored and n not in cells] + list(code.co_cellvars)


def restore_locals(code: types.CodeType, scope: Scope) -> list:
    """[.., r] -> [.., r] with the locals of ``r[2]`` stored (unbound where the dict lacks them)."""
    cells = set(code.co_cellvars)
    out = [bclib.Instr("COPY", 1), bclib.Instr("LOAD_CONST", 2), bclib.Instr("BINARY_SUBSCR")]
    for n in _restored_names(code, scope):  # [r, d]
        unset, nxt = bclib.Label(), bclib.Label()

        def op(kind, n=n):
            return bclib.Instr(f"{kind}_DEREF", bclib.CellVar(n)) if n in cells else bclib.Instr(f"{kind}_FAST", n)
        out += [bclib.Instr("LOAD_CONST", n), bclib.Instr("COPY", 2), bclib.Instr("CONTAINS_OP", 0),
                _pop_jump(False, unset),
                bclib.Instr("COPY", 1), bclib.Instr("LOAD_CONST", n), bclib.Instr("BINARY_SUBSCR"), op("STORE"),
                bclib.Instr("JUMP_FORWARD", nxt),
                unset, bclib.Instr("LOAD_CONST", None), op("STORE"), op("DELETE"),  # unbound, as in the segment
                nxt]
    return out + [bclib.Instr("POP_TOP")]


def raise_at_call(code: types.CodeType, scope: Scope, done) -> list:
    """Right after a segment call inside a ``try`` around the loop: a segment that raised (RAISE,
    caught by ``catching``) gives its locals back and the exception is raised here, where the
    original handler expects it, and sees what eager would see."""
    return [bclib.Instr("COPY", 1), bclib.Instr("LOAD_CONST", 0), bclib.Instr("BINARY_SUBSCR"),
            bclib.Instr("LOAD_CONST", RAISE), bclib.Instr("COMPARE_OP", bclib.Compare.EQ), _pop_jump(False, done),
            *restore_locals(code, scope),
            bclib.Instr("LOAD_CONST", 1), bclib.Instr("BINARY_SUBSCR"), bclib.Instr("LOAD_CONST", 0),
            bclib.Instr("BINARY_SUBSCR"), bclib.Instr("RAISE_VARARGS", 1)]


RAISE = -2  # a segment called from inside a try around its loop raised: (RAISE, (exc,), locals)
SCOPED_CODES: dict = {}  # id(code) -> code of every scoped copy (its frame's locals are the loop's)


def catching(segment, code: types.CodeType):
    """``segment`` for a driver inside a user ``try``: an exception comes back as (RAISE, (exc,),
    locals), the locals of the innermost native copy it passed through (a frame kept alive by the
    traceback), so the handler sees the state at the raise."""
    names = set(code.co_varnames) | set(code.co_cellvars)

    def call(stack, locals_):
        try:
            return segment(stack, locals_)
        except Exception as exc:
            state = locals_
            tb = exc.__traceback__
            while tb is not None:
                c = tb.tb_frame.f_code
                if SCOPED_CODES.get(id(c)) is c:
                    state = {k: v for k, v in tb.tb_frame.f_locals.items() if k in names}
                tb = tb.tb_next
            return (RAISE, (exc,), state)
    call.__name__ = f"__catching_{getattr(segment, '__name__', 'segment')}"
    return call


def dispatch_block(label, code: types.CodeType, scope: Scope, stop_labels: dict, depths, exit_fn) -> list:
    """[r] -> for a stop inside the loop: locals restored from r[2], the stack from r[1], jump to the
    stop; anything else (a return, a way out of the loop) -> ``return exit_fn(r)``."""
    to_exit = bclib.Label()
    out = [label,
           bclib.Instr("COPY", 1), bclib.Instr("LOAD_CONST", 0), bclib.Instr("BINARY_SUBSCR"),
           bclib.Instr("LOAD_CONST", frozenset(stop_labels)), bclib.Instr("CONTAINS_OP", 0),
           _pop_jump(False, to_exit), *restore_locals(code, scope)]
    pushes = []
    for t, lab in sorted(stop_labels.items()):
        push = bclib.Label()
        out += [bclib.Instr("COPY", 1), bclib.Instr("LOAD_CONST", 0), bclib.Instr("BINARY_SUBSCR"),
                bclib.Instr("LOAD_CONST", t), bclib.Instr("COMPARE_OP", bclib.Compare.EQ), _pop_jump(True, push)]
        pushes += [push, bclib.Instr("LOAD_CONST", 1), bclib.Instr("BINARY_SUBSCR"),
                   bclib.Instr("LOAD_CONST", slice(None, None, -1)), bclib.Instr("BINARY_SUBSCR"),
                   bclib.Instr("UNPACK_SEQUENCE", depths[t]), bclib.Instr("JUMP_BACKWARD", lab)]
    out += [to_exit, *callable_under_tos(bclib.Instr("LOAD_CONST", exit_fn)), *_call(1), bclib.Instr("RETURN_VALUE")]
    return out + pushes


def stop_epilogue(label, target: int, depth: int) -> list:
    """A native scoped copy reached a stop: ``return (target, (stack...), locals())``."""
    return [label, bclib.Instr("BUILD_TUPLE", depth), bclib.Instr("LOAD_CONST", target), bclib.Instr("SWAP", 2),
            *null_and(bclib.Instr("LOAD_CONST", builtins.locals)), *_call(0),
            bclib.Instr("BUILD_TUPLE", 3), bclib.Instr("RETURN_VALUE")]


def tagged_return(ins: bclib.Instr) -> list:
    """A ``return`` inside a scoped copy: ``return (RETURN, (value,), None)``."""
    head = [bclib.Instr("LOAD_CONST", ins.arg, location=ins.location)] if ins.name == "RETURN_CONST" else []
    return head + [bclib.Instr("BUILD_TUPLE", 1, location=ins.location), bclib.Instr("LOAD_CONST", RETURN),
                   bclib.Instr("SWAP", 2), bclib.Instr("LOAD_CONST", None), bclib.Instr("BUILD_TUPLE", 3),
                   bclib.Instr("RETURN_VALUE")]


def stopped(target: int):
    """The continuation of a scoped region's exit at a stop: hand (target, stack, locals) back."""
    def stop(stack, locals_):
        return (target, stack, locals_)
    stop.__name__ = f"__stop_at_{target}"
    return stop


def fix_jump_directions(items: list) -> None:
    """3.11+ has separate forward and backward jumps (3.11 also for the conditional ones): choose by
    where each label ended up, after code was inserted and jumps retargeted."""
    where = {id(it): k for k, it in enumerate(items) if isinstance(it, bclib.Label)}
    for k, it in enumerate(items):
        if not (isinstance(it, bclib.Instr) and isinstance(it.arg, bclib.Label)):
            continue
        forward = where[id(it.arg)] > k
        if it.name in ("JUMP_FORWARD", "JUMP_BACKWARD"):
            it.name = "JUMP_FORWARD" if forward else "JUMP_BACKWARD"
        elif bc.PY < (3, 12) and it.name.startswith(("POP_JUMP_FORWARD_", "POP_JUMP_BACKWARD_")):
            cond = it.name.split("_", 3)[3]  # IF_TRUE, IF_NONE...
            it.name = f"POP_JUMP_{'FORWARD' if forward else 'BACKWARD'}_{cond}"


# ---- the copies ----------------------------------------------------------------------------------
def _before(items: list, obj) -> int:
    return next(i for i, it in enumerate(items) if it is obj)


def insert_driver(items: list, real: list, region, depths, segment_for, exit_fn, epilogues: list, code) -> int:
    """Turn ``region`` (the outermost driven loop) into a driver: a segment call where native
    control enters a body, one shared dispatch back to the loop control. Returns the stack the
    calls need."""
    drive = region.drive
    instrs = bc.decode(code)
    in_region = range(region.start, region.end + 1)
    entries = []
    for lp in drive.loops:
        entries += list(lp.body_entries)
        if lp is not drive.loops[0] and lp.exit is not None and lp.exit in drive.inside:
            entries.append(lp.exit)  # an inner driven loop ran out: the rest of the outer body
    entries = [e for e in dict.fromkeys(entries)
               if e in in_region and e not in drive.protected and depths[e] is not None
               and not (e in drive.controls and e not in (h for lp in drive.loops for h in lp.body_entries))
               and not _jumps_to_control(instrs[e], drive)]
    targets = sorted(t for t in drive.dispatch if t in in_region and depths[t] is not None)
    stop_labels = {}
    for t in targets:  # before the segment call a while head has: the dispatch runs it again
        stop_labels[t] = bclib.Label()
        items.insert(_before(items, real[t]), stop_labels[t])
    dispatch = bclib.Label()
    need = 0
    in_try = _inside_user_try(code, drive)
    for e in entries:
        done = bclib.Label()
        pos = _before(items, real[e])
        if in_try:
            call = segment_call(depths[e], catching(segment_for(e), code), raise_at_call(code, drive, done))
        else:
            call = segment_call(depths[e], segment_for(e), [bclib.Instr("JUMP_FORWARD", done)])
        items[pos:pos] = call
        epilogues.extend(drop_stack(done, depths[e], dispatch))
        need = max(need, 2 * depths[e] + 8)
    epilogues.extend(dispatch_block(dispatch, code, drive, stop_labels, depths, exit_fn))
    return max([need] + [depths[t] + 6 for t in targets])


def _inside_user_try(code: types.CodeType, drive: Scope) -> bool:
    """Is the driven loop inside a user ``try`` whose handler may read the locals the body sets?"""
    instrs = bc.decode(code)
    off = instrs[drive.loops[0].first].offset
    index_of = {i.offset: i.index for i in instrs}
    return any(e.start <= off < e.end and index_of.get(e.target) not in drive.inside and _user_try_handler(code, e)
               for e in bc.exception_entries(code))


def _jumps_to_control(ins, drive: Scope) -> bool:
    """A body entry that is only a jump back to the loop control needs no segment."""
    return ins.opname in _UNCONDITIONAL and ins.target is not None and \
        (ins.target in drive.controls or ins.target not in drive.inside)


def apply_scope(items: list, real: list, decoded, scope: Scope, depths, start: int, start_label, epilogues: list) -> None:
    """A copy that runs natively inside a driven loop: each arrival at one of the loop's stops
    returns ``(stop, stack, locals)`` to the driver, and each ``return`` is tagged (see the module
    docstring)."""
    arrivals = set()
    for k in scope.inside:
        if k >= len(decoded):
            continue
        for t in _successors(decoded[k], decoded):
            if t < len(decoded) and scope.stops_copy(t):
                arrivals.add(t)
    for t in sorted(arrivals):
        if depths[t] is None:
            continue  # nothing reaches it
        lab = bclib.Label()
        epilogues.extend(stop_epilogue(lab, t, depths[t]))
        # the copy's own start may be a stop (a while loop's head): its prologue jumps past this
        pos = _before(items, start_label) if t == start else _before(items, real[t])
        items.insert(pos, bclib.Instr("JUMP_FORWARD", lab))
    for k in sorted(scope.inside):
        if k < len(decoded) and decoded[k].opname in ("RETURN_VALUE", "RETURN_CONST"):
            pos = _before(items, real[k])
            items[pos:pos + 1] = tagged_return(real[k])
