"""Decoding of code objects into instructions: the one module that knows CPython versions.

The interpreter works on ``Instr`` records: jump targets resolved to instruction indices, EXTENDED_ARG
and CACHE entries removed. Version differences that only change *decoding* live here; version
differences in *semantics* live in the handlers' registration ranges.
"""
from __future__ import annotations

import dis
import sys
import types
from dataclasses import dataclass
from functools import lru_cache

from ember.frontend.errors import CompileError

PY = sys.version_info[:2]
SUPPORTED = ((3, 11), (3, 12))
# 3.13: decoding, the handler table (handlers/py313.py) and the graph-break code generation cover it, and
# what runs without torch is tested on 3.13 (tests/frontend/test_py313.py). It stays out of SUPPORTED
# until the frontend has run end to end on 3.13: there is no torch for 3.13 where ember is developed.
DECODES = SUPPORTED + ((3, 13),)

# How many instructions past its target an exhausted FOR_ITER resumes: 3.11 targets the loop's exit;
# 3.12 targets END_FOR and skips it; 3.13 targets END_FOR and skips it and the POP_TOP after it.
FOR_ITER_SKIP = {(3, 11): 0, (3, 12): 1}.get(PY, 2)

# BINARY_OP argument -> (symbol, is_inplace); from CPython's own table so it cannot drift.
NB_OPS = [(sym.rstrip("="), sym.endswith("=") and sym not in ("==",)) for _name, sym in dis._nb_ops]


@dataclass(slots=True)
class Instr:
    index: int
    opname: str
    arg: int | None
    argval: object
    offset: int
    lineno: int | None
    target: int | None = None  # index of the jump target, for jump instructions

    def __repr__(self) -> str:
        tgt = f" -> {self.target}" if self.target is not None else ""
        return f"{self.index:4d} {self.opname} {self.argval!r}{tgt}"


JUMP_OPS = set(dis.hasjrel) | set(dis.hasjabs)


@lru_cache(maxsize=4096)
def decode(code: types.CodeType) -> tuple[Instr, ...]:
    every = list(dis.get_instructions(code))
    raw = [i for i in every if i.opname not in ("CACHE", "EXTENDED_ARG")]
    # a jump may target an EXTENDED_ARG prefix: map every offset to the next kept instruction
    by_offset, k = {}, 0
    for ins in every:
        by_offset[ins.offset] = k
        if ins.opname not in ("CACHE", "EXTENDED_ARG"):
            k += 1
    out = []
    lineno = code.co_firstlineno
    for k, ins in enumerate(raw):
        if ins.positions is not None and ins.positions.lineno is not None:
            lineno = ins.positions.lineno
        target = None
        if ins.opcode in JUMP_OPS:
            target = by_offset[ins.argval]
        out.append(Instr(k, ins.opname, ins.arg, ins.argval, ins.offset, lineno, target))
    return tuple(out)


@lru_cache(maxsize=4096)
def exception_entries(code: types.CodeType) -> tuple:
    """The code's exception table: entries with start/end/target offsets, stack depth and lasti."""
    parse = getattr(dis, "_parse_exception_table", None)
    return tuple(parse(code)) if parse is not None else ()


def exception_handler(code: types.CodeType, offset: int):
    """The exception-table entry covering ``offset`` (the handler a raise there jumps to), or None."""
    for e in exception_entries(code):
        if e.start <= offset < e.end:
            return e
    return None


# fast locals an instruction assigns or unbinds (3.13's superinstructions carry a pair of names)
_WRITES_ONE = ("STORE_FAST", "DELETE_FAST", "LOAD_FAST_AND_CLEAR")


def fast_locals_written(ins: Instr) -> tuple:
    if ins.opname in _WRITES_ONE:
        return (ins.argval,)
    if ins.opname == "STORE_FAST_STORE_FAST":
        return tuple(ins.argval)
    if ins.opname == "STORE_FAST_LOAD_FAST":
        return (ins.argval[0],)
    return ()


def cells_loaded(code: types.CodeType, ins: Instr) -> tuple:
    """Cell variables ``ins`` pushes as cells (to build a closure): LOAD_CLOSURE up to 3.12; 3.13
    dropped it for a LOAD_FAST of the cell's slot."""
    if ins.opname == "LOAD_CLOSURE":
        return (ins.argval,)
    if PY >= (3, 13) and ins.opname in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST"):
        names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
        return tuple(n for n in names if n in code.co_cellvars or n in code.co_freevars)
    return ()


def index_at(code: types.CodeType, offset: int) -> int:
    """Decoded instruction index at a byte offset."""
    return next(i.index for i in decode(code) if i.offset >= offset)


def check_python_version() -> None:
    if PY not in SUPPORTED:
        raise CompileError(
            f"ember supports CPython 3.11 and 3.12; this is {sys.version.split()[0]}"
            + (" (3.13's bytecode is decoded, but ember has not been run end to end on 3.13 yet). "
               if PY in DECODES else ". ")
            + "Use Python 3.11 or 3.12, or call the function without ember.compile."
        )


CO_GENERATOR = 0x20
CO_COROUTINE = 0x80
CO_ASYNC_GENERATOR = 0x200
CO_ITERABLE_COROUTINE = 0x100
