"""What can be checked of ember's 3.13 support without torch (there is no torch wheel for 3.13 here).

Run under CPython 3.13 with the ``bytecode`` package importable, e.g.::

    python3.13 -m pip install --target /tmp/py313 bytecode==0.19.1
    PYTHONPATH=/tmp/py313:$PWD python3.13 tests/frontend/py313_runner.py

(tests/frontend/test_py313.py does this when a python3.13 is found). It checks:

1. ``ember.frontend.bytecode`` imports without torch and decodes every code object of a corpus
   (nested code included): no CACHE / EXTENDED_ARG left, every jump target resolved to an index,
   FOR_ITER targets an END_FOR followed by POP_TOP (what handlers/py313.py's FOR_ITER relies on),
   superinstructions' argval is a pair of names, exception tables parse.
2. Handler coverage: every opcode in the corpus has a handler registered for (3, 13). The handler
   modules import torch, so the registrations are read statically (``register(...)`` /
   ``unsupported(...)`` calls with their ``versions=`` ranges) from ember/frontend/handlers/*.py.

It does NOT run the interpreter, guards or graph-break code generation on 3.13 (they need torch).
Exit status 0 when all checks pass; failures are printed one a line.
"""
from __future__ import annotations

import ast
import dis
import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ember.frontend import bytecode as bc  # noqa: E402  (must not need torch)

DEFAULT_RANGE = ((3, 11), (3, 13))  # keep in step with register() in ember/frontend/handlers/__init__.py


# ---- handler table, read statically ------------------------------------------------------------
def _literal_range(call: ast.Call, default):
    for kw in call.keywords:
        if kw.arg == "versions":
            if isinstance(kw.value, ast.Name):  # a module-level constant such as V313
                return kw.value.id
            return ast.literal_eval(kw.value)
    return default


def registrations() -> list[tuple[str, tuple, str]]:
    """(opname, (lo, hi), file) for every register()/unsupported() call in the handler modules."""
    out = []
    for path in sorted((ROOT / "ember/frontend/handlers").glob("*.py")):
        tree = ast.parse(path.read_text())
        consts = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Tuple)
                  and t.id.startswith("V")}
        init = ast.parse((ROOT / "ember/frontend/handlers/__init__.py").read_text())
        register_def = next(n for n in init.body if isinstance(n, ast.FunctionDef) and n.name == "register")
        default = ast.literal_eval(register_def.args.kw_defaults[0])
        assert default == DEFAULT_RANGE, f"register()'s default range is {default}; update DEFAULT_RANGE"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id == "register":
                rng = _literal_range(node, default)
                rng = consts.get(rng, rng)
            elif node.func.id == "unsupported":
                rng = ((0, 0), (99, 99))  # a refusal with a reason: covers every version
            else:
                continue
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.append((arg.value, tuple(map(tuple, rng)), path.name))
    return out


def handled_on(version: tuple) -> dict[str, str]:
    return {name: f for name, (lo, hi), f in registrations() if lo <= version <= hi}


# ---- corpus ------------------------------------------------------------------------------------
def corpus_functions() -> list:
    import tests.frontend.py313_corpus as corpus
    out = []
    for k, v in vars(corpus).items():
        if isinstance(v, types.FunctionType) and not k.startswith("_"):
            out.append(v)
        elif isinstance(v, type) and v.__module__ == corpus.__name__:  # methods (super(), ...)
            out += [m for m in vars(v).values() if isinstance(m, types.FunctionType)]
    return out


def hot(n):
    """Run often enough for 3.13 to specialize it (and, were the JIT on, to attach executors)."""
    acc = 0
    for i in range(n):
        acc += len([i]) + abs(-i)
    return acc


def check_specialization_hidden(failures: list) -> None:
    # decode() reads co_code, which CPython de-specializes: ENTER_EXECUTOR, RESUME_CHECK, BINARY_OP_ADD_INT...
    # must never reach the handler table, however hot the function
    for _ in range(200):
        hot(100)
    names = {i.opname for i in bc.decode(hot.__code__)}
    specialized = sorted(n for n in names if n not in dis.opmap or n == "ENTER_EXECUTOR")
    if specialized:
        failures.append(f"decode() of a hot function shows specialized instructions: {specialized}")


def all_code(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from all_code(c)


def check_decode(code: types.CodeType, failures: list) -> set[str]:
    instrs = bc.decode(code)
    names = {i.opname for i in instrs}
    where = f"{code.co_qualname}"
    if names & {"CACHE", "EXTENDED_ARG"}:
        failures.append(f"{where}: CACHE/EXTENDED_ARG left in decode()")
    for i in instrs:
        if i.opname in _JUMP_NAMES:
            if i.target is None or not 0 <= i.target < len(instrs):
                failures.append(f"{where}: {i!r} has no resolved target")
        if i.opname == "FOR_ITER" and [x.opname for x in instrs[i.target:i.target + 2]] != ["END_FOR", "POP_TOP"]:
            failures.append(f"{where}: {i!r} does not target END_FOR, POP_TOP")
        if i.opname in ("LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST") and not (
                isinstance(i.argval, tuple) and len(i.argval) == 2 and all(n in code.co_varnames for n in i.argval)):
            failures.append(f"{where}: {i!r}: argval is not a pair of local names")
    if [i.opname for i in instrs] != [d.opname for d in dis.get_instructions(code)
                                      if d.opname not in ("CACHE", "EXTENDED_ARG")]:
        failures.append(f"{where}: decode() order differs from dis")
    try:
        for e in bc.exception_entries(code):
            bc.index_at(code, e.target)
    except Exception as exc:  # noqa: BLE001  (report, keep checking)
        failures.append(f"{where}: exception table: {exc!r}")
    return names


_JUMP_NAMES = {dis.opname[o] for o in bc.JUMP_OPS}
# opcodes the 3.13 compiler can emit into a function body that ember leaves to a graph break or refuses
# (no handler: the interpreter's "no handler" path raises Unsupported); listed so coverage fails on
# anything *else*
KNOWN_UNHANDLED = {"CALL_INTRINSIC_2", "CLEANUP_THROW", "GET_AWAITABLE", "GET_AITER", "GET_ANEXT",
                   "END_ASYNC_FOR", "BEFORE_ASYNC_WITH", "MATCH_CLASS", "MATCH_MAPPING", "MATCH_SEQUENCE",
                   "MATCH_KEYS", "SETUP_FINALLY", "SETUP_CLEANUP", "SETUP_WITH", "POP_BLOCK"}


# 3.13's new or changed opcodes: the corpus must contain each, or the coverage check proves little
MUST_SEE = {"LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "CALL", "CALL_KW",
            "CALL_FUNCTION_EX", "LOAD_GLOBAL", "LOAD_ATTR", "LOAD_SUPER_ATTR", "TO_BOOL", "COMPARE_OP",
            "MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE", "CONVERT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC",
            "FOR_ITER", "END_FOR", "RETURN_CONST"}


def main() -> int:
    failures: list[str] = []
    if bc.PY != (3, 13):
        failures.append(f"runner needs CPython 3.13, this is {sys.version.split()[0]}")
    if "torch" in sys.modules:
        failures.append("ember.frontend.bytecode imported torch")
    seen: dict[str, str] = {}
    n_code = 0
    for fn in corpus_functions():
        for code in all_code(fn.__code__):
            n_code += 1
            for name in check_decode(code, failures):
                seen.setdefault(name, code.co_qualname)
    check_specialization_hidden(failures)
    absent = sorted(MUST_SEE - set(seen))
    if absent:
        failures.append(f"the corpus no longer exercises {absent}")
    table = handled_on((3, 13))
    missing = sorted(n for n in seen if n not in table and n not in KNOWN_UNHANDLED)
    for n in missing:
        failures.append(f"no 3.13 handler for {n} (first seen in {seen[n]})")
    new_313 = sorted(n for n, (lo, _hi), _f in registrations() if lo == (3, 13))
    print(f"decoded {n_code} code objects, {len(seen)} distinct opcodes; "
          f"{len(table)} opcodes handled on 3.13 ({len(new_313)} registrations start at 3.13)")
    print("opcodes in corpus:", " ".join(sorted(seen)))
    print("not handled (known):", " ".join(sorted(set(seen) & KNOWN_UNHANDLED)) or "-")
    for f in failures:
        print("FAIL", f)
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
