"""Helpers shared by the benchmark scripts that run one measured process per case."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def exclusive_lock(path: str | None):
    """Held around a measurement, so parallel jobs never share the machine during it. No path: no
    lock."""
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_measured(cmd: list, env: dict, cwd: str, timeout: float, base: dict) -> dict:
    """Run one measured child process, which prints its record as a ``RESULT {json}`` line: that
    record with ``process_s`` (the wall time), else ``base`` with status "failed" (or "skipped" for a
    missing module) and the last line of its stderr. On timeout the child's whole session is killed
    (torch.compile's compile workers too)."""
    import json
    import os
    import re
    import signal
    import subprocess
    import time

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return dict(base, status="failed", error=f"timed out after {timeout:.0f} s")
    wall = round(time.perf_counter() - t0, 1)
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]), process_s=wall)
    err = [ln for ln in stderr.strip().splitlines() if ln.strip()] or ["no output"]
    status = "skipped" if re.search(r"No module named '([\w.]+)'", stderr) else "failed"
    return dict(base, status=status, error=f"exit {proc.returncode}: {err[-1][:400]}", process_s=wall)
