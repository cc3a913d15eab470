"""Command line: `ember --version`, `ember backends`, `ember config`, `ember run script.py [args...]`,
`ember bench [options]` (timings of eager vs ember; see ember/bench/).

`ember run` executes a script as `__main__` with `torch.compile` routed to `ember.compile` and the rest of
the torch.compile surface (torch.compiler, torch._dynamo, torch._dynamo.config, torch._inductor.config)
translated by ember/dropin, so an unmodified torch.compile program runs through ember. `python -m ember`
is the same command.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback


def _backends() -> int:
    from ember.backends.registry import backend_spec, list_backends

    default = set(list_backends())
    for name in list_backends(exclude_tags=()):
        spec = backend_spec(name)
        notes = [f"tags: {', '.join(spec.tags)}"] if spec.tags else []
        if spec.name != name:
            notes.append(f"alias of {spec.name}")
        if spec.origin != "registered":
            notes.append(f"from entry point group {spec.origin}")
        if name not in default:
            notes.append("hidden from list_backends() by default")
        print(f"{name:<16} {'; '.join(notes)}".rstrip())
    return 0


def _config() -> int:
    from ember.config import ENV_TABLE, config

    for env, name, default, doc in ENV_TABLE:
        print(f"{env:<26} {name} = {getattr(config, name)!r}  (default {default!r})\n{'':<26} {doc}")
    return 0


RUN_USAGE = """usage: ember run SCRIPT.py [ARGS...]

Runs SCRIPT.py as `python SCRIPT.py ARGS...` would, with torch.compile (and torch.compiler,
torch._dynamo, torch._inductor.config) routed to ember: an unmodified torch.compile program
compiles through ember. Mapping of each setting: docs/dropin.md.
"""


def _run(script: str | None, args: list[str]) -> int:
    if script is None:
        sys.stderr.write(RUN_USAGE)
        return 2
    if not os.path.exists(script):
        sys.stderr.write(f"ember run: {script}: no such file (run it from the script's folder, or give its path)\n")
        return 2
    from ember.config import config
    from ember.dropin import Session

    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
    try:
        with Session():
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # keep the script's own exit status
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Exception as exc:  # noqa: BLE001 - the script's own error, shown as `python script.py` shows it
        tb = exc.__traceback__
        path = os.path.abspath(script)
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
            tb = tb.tb_next  # ember run's own frames (this function, runpy) are not the script's
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        return 1
    finally:
        if config.run_stats:
            Session.write_stats(config.run_stats)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember", description="ember: a pure-Python torch.compile")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a script with torch.compile routed to ember.compile")
    run.add_argument("script", nargs="?", help="the Python file to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    sub.add_parser("backends", help="list the available backends, with tags and aliases")
    sub.add_parser("config", help="show ember.config: each field, its EMBER_* variable and current value")
    from ember.bench import add_arguments as bench_arguments

    bench_arguments(sub.add_parser("bench", help="time workloads eager vs ember (and torch.compile from a checkout)"))
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
        return _backends()
    if ns.command == "config":
        return _config()
    if ns.command == "bench":
        from ember.bench import main as bench

        return bench(ns)
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
