"""Mutation testing for ember: does the test suite notice when a guard, an opcode handler, a
lowering or the autograd layer is quietly broken?

Each mutant below is one small, plausible bug: an exact source snippet in one file and its
replacement, plus the test selection that should fail when the bug is present ("kill" it). The script
copies the tree (``ember/``, ``tests/``, ``pyproject.toml``) to a temporary directory once, then for
each mutant applies it to the copy, runs its selection there with pytest (cwd = the copy, so the copy's
``ember`` is imported), records killed/survived and restores the file. A survivor is a hole in the
tests: add the test that kills it (or, if the mutant cannot change behaviour, drop it and say why).

    python tools/mutation.py                  # every mutant, then a table and the kill rate
    python tools/mutation.py --list           # names, files and selections
    python tools/mutation.py --only NAME ...  # some mutants
    python tools/mutation.py --check          # only check that every snippet occurs exactly once
    python tools/mutation.py --baseline       # also run each selection unmutated first (must pass)

Exit status: 0 when every mutant run was killed, 1 when one survived, 2 when the list is stale (a
snippet no longer occurs exactly once: the code moved; update the mutant) or a baseline fails.
This file is not a test module (pytest collects ``tests/`` only); tests/test_mutation_list.py keeps
the snippets current.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIED = ("ember", "tests", "pyproject.toml")


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str          # relative to the repository root: a file, or a folder ending in "/" (its .py files)
    old: str           # must occur exactly once in the file (in all of the folder's files together)
    new: str
    tests: tuple       # pytest arguments (paths, -k expressions) that must fail with the mutant
    why: str = ""      # the bug it stands for


def M(name, file, old, new, *tests, why=""):
    return Mutant(name, file, old, new, tuple(tests), why)


GUARDS = "ember/frontend/guards.py"
HANDLERS = "ember/frontend/handlers/"
# lowerings are found anywhere in ember/native/: they may move between its modules (an op registry)
LOWER = "ember/native/"
AOT = "ember/aot/"
T_GUARDS = "tests/frontend/test_guard_strength.py"
T_HANDLERS = "tests/frontend/test_handler_strength.py"
T_OPS = "tests/native/test_ops.py"
T_AOT = "tests/aot/test_aot_semantics.py"

MUTANTS: list[Mutant] = [
    # ---- guards --------------------------------------------------------------------------------
    M("guard_tensor_stride", GUARDS, 'sizes = [f"{v}.shape == {m.shape!r}", f"{v}.stride() == {m.stride!r}"]',
      'sizes = [f"{v}.shape == {m.shape!r}"]', T_GUARDS,
      why="a graph specialised on one layout reused for a transposed / strided input"),
    M("guard_tensor_dtype", GUARDS, 'f"{v}.dtype is {const(m.dtype, \'dtype\')}",', "", T_GUARDS,
      why="a float32 graph reused for float64 inputs"),
    M("guard_tensor_requires_grad", GUARDS, ' + [f"{v}.requires_grad is {m.requires_grad}"]', "", T_GUARDS,
      why="an inference graph reused when an input now needs a gradient"),
    M("guard_dynamic_stride", GUARDS,
      'sizes += [f"{v}.stride({i}) == {n}" for i, n in enumerate(m.stride) if n is not None]',
      "pass", T_GUARDS, why="with dynamic shapes, the static strides are no longer checked"),
    M("guard_hooks_pre", GUARDS, 'return f"not ({v}._forward_hooks or {v}._forward_pre_hooks)"',
      'return f"not ({v}._forward_hooks)"', T_GUARDS,
      why="a forward pre-hook registered after the first compile never runs"),
    M("guard_const_type", GUARDS, 'return f"type({v}) is {const(type(e), \'type\')} and {v} == {lit}"',
      'return f"{v} == {lit}"', T_GUARDS, why="f(x, 1) and f(x, 1.0) share a cache entry"),
    M("guard_const_value", GUARDS, 'and {v} == {lit}"', '"', T_GUARDS,
      why="only the type of a Python scalar argument is checked"),
    M("guard_len", GUARDS, 'return f"len({v}) == {e!r}"', 'return f"len({v}) >= {e!r}"', T_GUARDS,
      why="a graph unrolled over a list reused for a longer list"),
    M("guard_dict_keys_order", GUARDS, 'return f"tuple({v}) == {const(tuple(e), \'keys\')}"',
      'return f"sorted({v}) == sorted({const(tuple(e), \'keys\')})"', T_GUARDS,
      why="dict iteration order is baked into the graph but not checked"),
    M("guard_alias", GUARDS, 'return f"{v} is {load(g.other)}"', 'return "True"', T_GUARDS,
      why="a graph traced with f(x, x) reused for two distinct tensors"),
    M("guard_dynamic_tie", "ember/frontend/dynamic.py", 'return f"{load(source)}.{kind}({dim}) == {self.text}"',
      'return "True"', T_GUARDS, why="with dynamic shapes, a stride or size tied to a symbol is not checked"),
    M("guard_global_default_dtype", GUARDS, "        torch.get_default_dtype(),\n", "", T_GUARDS,
      why="a graph that created float32 tensors reused under set_default_dtype(float64)"),
    # ---- opcode handlers ------------------------------------------------------------------------
    M("handler_is_not", HANDLERS, "tx.push(ConstantVariable(r != bool(inst.arg)))",
      "tx.push(ConstantVariable(r))", T_HANDLERS, why="`a is not b` traced as `a is b`"),
    M("handler_not_in", HANDLERS, "    if inst.arg:\n        r = ConstantVariable(not r.truth(tx))",
      "    if False:\n        r = ConstantVariable(not r.truth(tx))", T_HANDLERS,
      why="`k not in d` traced as `k in d`"),
    M("handler_const_key_map_order", HANDLERS, "tx.push(DictVariable(dict(zip(keys, values))))",
      "tx.push(DictVariable(dict(zip(keys, reversed(values)))))", T_HANDLERS,
      why="a {'a': x, 'b': y} literal pairs keys with the wrong values"),
    M("handler_unpack_ex_head", HANDLERS, "    for v in reversed(head):\n        tx.push(v)",
      "    for v in head:\n        tx.push(v)", T_HANDLERS, why="`a, b, *rest = seq` swaps a and b"),
    M("handler_format_conversion", HANDLERS, "conv = _CONVERSIONS[inst.arg & 0x03]",
      "conv = None", T_HANDLERS, why="f'{s!r}' formats like f'{s}'"),
    M("handler_jump_if_true_or_pop", HANDLERS,
      "    if tx.stack[-1].truth(tx):\n        tx.jump(inst)",
      "    if not tx.stack[-1].truth(tx):\n        tx.jump(inst)",
      T_HANDLERS, why="`a or b` picks the wrong operand (3.11 bytecode)"),
    # ---- native lowerings -----------------------------------------------------------------------
    M("lower_leaky_relu_slope", LOWER, 'ir.op("mul", a, c(slope, a))', 'ir.op("mul", a, c(0.01, a))',
      T_OPS, "-k", "leaky_relu", why="leaky_relu ignores negative_slope"),
    M("lower_elu_input_scale", LOWER, 'ir.op("expm1", ir.op("mul", a, c(input_scale, a)))', 'ir.op("expm1", a)',
      T_OPS, "-k", "elu and not gelu", why="elu ignores input_scale"),
    M("lower_elu_scale", LOWER, 'ir.op("mul", a, c(scale, a)), neg)', "a, neg)", T_OPS, "-k", "elu and not gelu",
      why="elu/selu ignore scale on the positive side"),
    M("lower_elu_alpha", LOWER, "c(alpha * scale, a))", "c(scale, a))", T_OPS, "-k", "elu and not gelu",
      why="elu ignores alpha"),
    M("lower_hardtanh_bounds", LOWER, "lo = -1.0 if lo is None else lo", "lo = -1.0", T_OPS, "-k", "hardtanh or relu6",
      why="hardtanh ignores min_val"),
    M("lower_pow_neg2", LOWER, '-2: lambda x: ir.op("reciprocal", ir.op("mul", x, x))',
      '-2: lambda x: ir.op("reciprocal", x)', T_OPS, "-k", "pow", why="x ** -2 computed as 1 / x"),
    M("lower_round_decimals", LOWER, "s = 10.0 ** decimals", "s = 10.0", T_OPS, "-k", "round",
      why="torch.round(x, decimals=d) rounds to one decimal"),
    M("lower_div_trunc_float", LOWER, 'rnd = "trunc" if rounding_mode == "trunc" else "floor"', 'rnd = "floor"',
      T_OPS, "-k", "div", why="float div(rounding_mode='trunc') floors negative quotients"),
    M("lower_pad_value", LOWER, 'ir.op("where", mask, ir.masked(mask, val, 0), ir.const(value, out.dtype))',
      'ir.op("where", mask, ir.masked(mask, val, 0), ir.const(0, out.dtype))', T_OPS, "-k", "pad",
      why="F.pad ignores value"),
    M("lower_var_correction", LOWER, "c = 1 if correction is None else correction", "c = 1", T_OPS, "-k", "var",
      why="var/std ignore correction"),
    M("lower_arange_step", LOWER, "(nums[0], nums[2] if len(nums) > 2 else 1)", "(nums[0], 1)", T_OPS, "-k", "arange",
      why="arange ignores step"),
    M("lower_add_alpha", LOWER, "if alpha is not None and alpha != 1:", "if False:", T_OPS, "-k", "alpha or rsub",
      why="add/sub ignore alpha"),
    M("lower_empty_prod_identity", LOWER, '{"sum": 0, "prod": 1, "any": False, "all": True}',
      '{"sum": 0, "prod": 0, "any": False, "all": True}', T_OPS, "-k", "empty",
      why="prod over an empty dimension gives 0"),
    # ---- autograd layer -------------------------------------------------------------------------
    M("aot_copy_back_skipped", AOT, "    for k, i in one_by_one:\n",
      "    for k, i in one_by_one[:0]:\n", T_AOT, why="a mutated input is not written back"),
    M("aot_under_no_grad", AOT,
      "under_no_grad = data and bool(torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(inner))",
      "under_no_grad = data", T_AOT, why="a mutation made under grad mode is copied back without autograd"),
    M("aot_missing_grad_ones", AOT,
      "torch.zeros(shape, dtype=dtype, device=device) if g is None",
      "torch.ones(shape, dtype=dtype, device=device) if g is None",
      T_AOT, why="an output the loss ignores contributes a gradient"),
    M("aot_regenerate_view_grad", AOT, "if info.requires_grad or not base.requires_grad:", "if True:",
      T_AOT, why="a view of a detached input comes back requiring grad"),
    M("aot_double_backward_silent", AOT, "            if create_graph:\n                result = _poison(result)\n",
      "", T_AOT, why="double backward through a compiled graph silently gives zero"),
    M("native_random_order", "ember/native/scheduler.py", "            self.after[id(a)] = b\n", "",
      "tests/native/test_cpp.py", "-k", "random_ops_keep_program_order",
      why="a fused kernel reorders draws: other numbers than eager for the same seed"),
    M("np_random_seed_after_draw", "ember/frontend/variables/numpy_random.py",
      "        if drawn:\n", "        if False:\n", "tests/fullgraph/test_numpy_random.py",
      why="np.random.seed after a draw of the same graph is hoisted before it"),
    M("np_random_seed_dropped", "ember/frontend/convert.py", "                      return_expr=return_expr, ns=cg.ns, before_call=before_call)",
      "                      return_expr=return_expr, ns=cg.ns, before_call=[])", "tests/fullgraph/test_numpy_random.py",
      why="np.random.seed in compiled code has no effect"),
    M("patchify_crop_dropped", "ember/native/patchify.py", "            if s != oi * k:", "            if False:",
      "tests/native/test_patchify.py", why="a patchify convolution over a size the kernel does not divide "
      "reads the positions the convolution drops"),
    M("patchify_channels_last_order", "ember/native/patchify.py", "[0, *outer, *inner, 1] if cl",
      "[0, *outer, 1, *inner] if cl", "tests/native/test_patchify.py",
      why="channels-last patch rows ordered (C, k...) against a weight ordered (k..., C)"),
]


# ---------------------------------------------------------------------------------------------------
def _files(m: Mutant, root: str) -> list[str]:
    """The files (relative to root) a mutant's snippet is looked for in."""
    if not m.file.endswith("/"):
        return [m.file]
    found = []
    for d, _, names in os.walk(os.path.join(root, m.file)):
        found += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".py")]
    return sorted(found)


def locate(m: Mutant, root: str = ROOT) -> tuple[list[str], int]:
    """(files holding the snippet, total number of occurrences)."""
    hits, total = [], 0
    for rel in _files(m, root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            n = f.read().count(m.old)
        if n:
            hits.append(rel)
            total += n
    return hits, total


def check(mutants, root=ROOT) -> list[str]:
    """Problems with the list: snippets not occurring exactly once, duplicate names, no-op mutants."""
    problems = []
    names = [m.name for m in mutants]
    problems += [f"duplicate mutant name {n}" for n in sorted({n for n in names if names.count(n) > 1})]
    for m in mutants:
        if not os.path.exists(os.path.join(root, m.file)):
            problems.append(f"{m.name}: {m.file} does not exist")
            continue
        hits, count = locate(m, root)
        if count != 1:
            problems.append(f"{m.name}: snippet occurs {count} times in {m.file} {hits or ''} (expected once; "
                            f"did the code move?)\n    {m.old!r}")
        if m.old == m.new:
            problems.append(f"{m.name}: replacement equals the snippet")
        if not m.tests:
            problems.append(f"{m.name}: no test selection")
    return problems


def copy_tree(dest: str) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, name), ignore=ignore)
        else:
            shutil.copy2(src, os.path.join(dest, name))


def _env(copy: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = copy  # the copy's ember, whatever is installed
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale bytecode between mutants of one file
    env["EMBER_CACHE_DIR"] = os.path.join(copy, ".ember_cache")  # never the user's cache
    return env


def run_tests(copy: str, tests, timeout: float) -> tuple[int | None, float, str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=_env(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - start, "timeout"
    out = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, time.monotonic() - start, out[-1] if out else ""


def verdict(rc) -> str:
    """pytest exit codes: 0 passed, 1 tests failed, 2/3 interrupted or internal error (the mutant
    broke import or collection: killed too), 5 nothing collected (a broken selection: an error)."""
    if rc is None:
        return "killed (timeout)"
    if rc == 0:
        return "SURVIVED"
    if rc == 5:
        return "ERROR (no tests selected)"
    return "killed" if rc == 1 else f"killed (pytest exit {rc})"


def mutate(copy: str, m: Mutant) -> tuple[str, str]:
    """Apply m in the copy; returns (the mutated file's path, its original text) to restore it."""
    hits, count = locate(m, copy)
    assert count == 1, m.name
    path = os.path.join(copy, hits[0])
    with open(path, encoding="utf-8") as f:
        original = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(original.replace(m.old, m.new))
    return path, original


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--check", action="store_true", help="only check that every snippet occurs exactly once")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    ap.add_argument("--baseline", action="store_true", help="first run each selection on the unmutated copy")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mutant (a timeout counts as killed)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = ap.parse_args(argv)

    mutants = MUTANTS
    if args.only:
        unknown = set(args.only) - {m.name for m in MUTANTS}
        if unknown:
            ap.error(f"unknown mutant(s): {', '.join(sorted(unknown))} (see --list)")
        mutants = [m for m in MUTANTS if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:30} {', '.join(locate(m)[0]) or m.file:36} {' '.join(m.tests)}\n{'':30} {m.why}")
        return 0
    problems = check(MUTANTS)
    if problems:
        print("mutation list is stale:\n" + "\n".join(problems), file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(MUTANTS)} mutants, every snippet occurs exactly once")
        return 0

    copy = tempfile.mkdtemp(prefix="ember_mutation_")
    try:
        copy_tree(copy)
        probe = subprocess.run([sys.executable, "-c", "import ember; print(ember.__file__)"], cwd=copy,
                               env=_env(copy), capture_output=True, text=True)
        if not probe.stdout.strip().startswith(copy):
            print(f"the copy's ember is not the one imported: {probe.stdout.strip()} {probe.stderr}", file=sys.stderr)
            return 2
        if args.baseline:
            for sel in dict.fromkeys(m.tests for m in mutants):
                rc, secs, last = run_tests(copy, sel, args.timeout)
                print(f"baseline {' '.join(sel)}: {'ok' if rc == 0 else 'FAILED'} ({secs:.0f}s) {last}", flush=True)
                if rc != 0:
                    return 2
        rows = []
        for m in mutants:
            path, original = mutate(copy, m)
            try:
                rc, secs, last = run_tests(copy, m.tests, args.timeout)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            rows.append((m, verdict(rc), secs, os.path.relpath(path, copy)))
            print(f"{m.name:30} {verdict(rc):26} {secs:5.0f}s  {last[:70]}", flush=True)
    finally:
        if args.keep:
            print(f"copy kept at {copy}")
        else:
            shutil.rmtree(copy, ignore_errors=True)

    print(f"\n{'mutant':30} {'file':36} {'result':26} time")
    for m, v, secs, rel in rows:
        print(f"{m.name:30} {rel:36} {v:26} {secs:4.0f}s")
    killed = sum(v.startswith("killed") for _, v, _, _ in rows)
    survivors = [m for m, v, _, _ in rows if v == "SURVIVED"]
    errors = [m for m, v, _, _ in rows if v.startswith("ERROR")]
    print(f"\nkill rate: {killed}/{len(rows)} ({100 * killed / max(len(rows), 1):.0f}%)")
    for m in survivors:
        print(f"survived: {m.name} ({m.file}): {m.why}")
    for m in errors:
        print(f"error: {m.name}: its selection {' '.join(m.tests)} collected no tests")
    return 1 if survivors or errors else 0


if __name__ == "__main__":
    sys.exit(main())
