"""Builds that run beside the process (C++ compiler runs in the build threads, Triton build worker
processes) run at ``config.build_nice`` more niceness than the process, so a build for a graph not
called yet takes a core from the process's own calls only where one is idle (issue 28: a compiling
process's steady calls were slower than a warm one's while its backward's units still compiled).
Linux: niceness is per thread, and the process a thread starts takes that thread's."""
import os
import subprocess
import sys

import pytest

from ember.config import config
from ember.native import build_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
NICE = [sys.executable, "-c", "import os; print(os.nice(0))"]


def _compiler_niceness(pool) -> int:
    return int(pool.submit(pool.run, NICE).result(timeout=120).stdout)


def test_a_build_threads_compiler_runs_at_lower_priority_and_the_process_does_not(monkeypatch):
    monkeypatch.setattr(config, "build_nice", 3)
    mine = os.nice(0)
    if mine + 3 > 19:
        pytest.skip("already at the lowest priority")
    pool = build_threads.BuildThreads(1, "test-nice")
    try:
        assert _compiler_niceness(pool) == mine + 3
    finally:
        pool.close()
    assert os.nice(0) == mine  # (the calling thread, the process's own: unchanged)


def test_build_nice_zero_leaves_priority_alone(monkeypatch):
    monkeypatch.setattr(config, "build_nice", 0)
    pool = build_threads.BuildThreads(1, "test-nice0")
    try:
        assert _compiler_niceness(pool) == os.nice(0)
    finally:
        pool.close()


def test_a_build_worker_process_is_lowered(monkeypatch):
    monkeypatch.setattr(config, "build_nice", 2)
    mine = os.nice(0)
    if mine + 2 > 19:
        pytest.skip("already at the lowest priority")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert build_threads.lower_priority(p.pid)
        assert os.getpriority(os.PRIO_PROCESS, p.pid) == mine + 2
    finally:
        p.kill()
        p.wait()


def test_build_nice_is_checked():
    with pytest.raises(ValueError, match="0..19"):
        config.build_nice = 20
