"""Run every graph-break case and print the failures grouped by symptom, with each case's source
as its repro (a draft for FAILURES.md).

    python -m tests.breaks.failure_report [-k SUBSTRING] > /tmp/breaks_failures.md
"""
from __future__ import annotations

import argparse
import collections
import inspect
import re
import sys


def _symptom(problem: str) -> str:
    first = problem.strip().splitlines()[0]
    if "crashed the interpreter" in first:
        return "interpreter crash (SIGSEGV)"
    if "hung" in first:
        return "hang"
    if "compiled raised but eager did not" in first or "compiled traceback tail" in problem:
        last = [ln.strip() for ln in problem.strip().splitlines() if ln.strip()][-1]
        last = re.sub(r"'[^']*'", "'…'", last)
        return f"compiled raised: {last[:90]}"
    if "eager raised" in first:
        return "eager raised, compiled did not"
    if "graph(s), expected" in first:
        warned = re.search(r"ember warned: ember: running \S+ eagerly: ([^|]*)", problem)
        return "no graph compiled" + (f" (whole-frame fallback: {warned.group(1).strip()})" if warned
                                      else "")
    if "fullgraph=True" in first:
        return "fullgraph=True did not raise CompileError"
    if "printed text differs" in first:
        return "printed text differs"
    if "state after the call" in first:
        return "Python-visible state differs"
    if "grad mode after" in first or "autocast after" in first:
        return "grad mode / autocast leaked"
    if "output" in first:
        return "wrong output"
    return first[:90]


def _source(c) -> str:
    try:
        fn = c.fn
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return "(source unavailable)"
    lines = src.splitlines()
    if len(lines) > 30:
        lines = lines[:30] + ["    ..."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    args = ap.parse_args(argv)

    from tests.breaks.harness import load_all_cases, run_case

    cases = [c for c in load_all_cases() if args.k in c.name]
    failures = []
    for c in cases:
        try:
            run_case(c)
        except AssertionError as e:
            body = str(e).split("\n", 1)[1] if "\n" in str(e) else str(e)
            problems = re.split(r"\n(?=- )", body)
            failures.append((c, [p[2:] if p.startswith("- ") else p for p in problems]))
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    groups = collections.defaultdict(list)
    for c, problems in failures:
        groups[_symptom(problems[0])].append((c, problems))
    print(f"# {len(failures)} of {len(cases)} cases fail\n")
    for sym, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"## {sym} ({len(items)})\n")
        for c, problems in items:
            print(f"### {c.name}\n\n```python\n{_source(c)}\n```\n")
            text = "\n".join(problems)
            print("```\n" + (text if len(text) <= 1500 else text[:1500] + " […]") + "\n```\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
