"""Command line: `ember --version`, `ember backends`, `ember run script.py [args...]`.

`ember run` executes a script as `__main__` with `torch.compile` routed to `ember.compile`, so an
unmodified torch.compile program runs through ember.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys


def _backend_names() -> list[str]:
    import ember

    lister = getattr(ember, "list_backends", None)
    if callable(lister):
        return sorted(lister())
    from ember.backends import registry  # fallback while list_backends is not exported

    for attr in ("list_backends", "names"):
        fn = getattr(registry, attr, None)
        if callable(fn):
            return sorted(fn())
    table = getattr(registry, "_BACKENDS", None) or getattr(registry, "BACKENDS", {})
    return sorted(table)


def _run(script: str, args: list[str]) -> int:
    import torch

    import ember

    original = torch.compile
    torch.compile = ember.compile
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # keep the script's own exit status
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        torch.compile = original
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember", description="ember: a pure-Python torch.compile")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a script with torch.compile routed to ember.compile")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    sub.add_parser("backends", help="list the registered backends")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    ns = p.parse_args(argv)
    if ns.version:
        import ember

        print(f"ember {ember.__version__}")
        return 0
    if ns.command == "run":
        return _run(ns.script, ns.args)
    if ns.command == "backends":
        for name in _backend_names():
            print(name)
        return 0
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
