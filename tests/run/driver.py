"""Run several scripts of tests/run/scripts under `ember run` in one interpreter (one torch import,
one transformers import), each as `ember run <script>` would, and print one JSON line per script:
its stdout, exit status and the compile counters it moved.

    python tests/run/driver.py SCRIPT.py [SCRIPT.py ...]

Between scripts: ember.reset(), the counters are read before and after, and the ember run session
puts torch's compile surface back (what one script sets does not reach the next).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys


def main(paths: list[str]) -> int:
    import ember
    from ember import cli
    from ember.diagnostics import counters

    for path in paths:
        ember.reset()
        before = counters.snapshot() + counters.compiled_snapshot()
        out = io.StringIO()
        cwd, argv, syspath = os.getcwd(), list(sys.argv), list(sys.path)
        os.chdir(os.path.dirname(os.path.abspath(path)))
        try:
            with contextlib.redirect_stdout(out):
                rc = cli.main(["run", os.path.basename(path)])
        except BaseException as exc:  # noqa: BLE001 - reported, and the next script still runs
            rc = f"{type(exc).__name__}: {exc}"
        finally:
            os.chdir(cwd)
            sys.argv, sys.path[:] = argv, syspath
        moved = {k: v for k, v in (counters.snapshot() + counters.compiled_snapshot() - before).items() if v}
        sys.__stdout__.write(json.dumps({"script": os.path.basename(path), "rc": rc, "stdout": out.getvalue(),
                                         "counters": moved}) + "\n")
        sys.__stdout__.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
