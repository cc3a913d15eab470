"""The threads that build C++ kernel units in the background (``cpp_build.submit``), and their end.

Daemon threads taking jobs from a queue, each job's result a ``concurrent.futures.Future``. Not a
``ThreadPoolExecutor``: its threads are joined when the interpreter exits, after running every job
still queued, so a script that ends (or is stopped with Ctrl-C) while a graph's units build in the
background would wait for each compiler run first (seconds each; 8 queued units on 2 threads kept a
finished script alive for 20 s). Here exit cancels instead: an ``atexit`` hook cancels the queued
jobs and kills the compiler processes still running (``run``), whose threads then stop at once.
Nothing half-built is kept: a build writes its library with an atomic rename only when the compiler
succeeded, so the next process builds what this one did not finish.
"""
from __future__ import annotations

import atexit
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

JOIN_AT_EXIT_S = 1.0  # how long exit lets threads whose compiler was killed clean up (temporary files)


def lower_priority(pid: int | None = None) -> bool:
    """Add ``config.build_nice`` to the niceness of process ``pid``, or (no pid) of the calling thread
    and so of every process it starts from then on (Linux: niceness is per thread, and a child takes
    its parent thread's). Why: a build running beside the process, for a graph not called yet (a
    backward's kernels while the forward runs, the next graph's while the process goes on), must not
    take a core from the process's own calls; where a core is idle it runs at full speed anyway, and
    the process waiting on it leaves its core idle. False where nothing was changed."""
    from ember.config import config
    nice = config.build_nice
    if nice <= 0 or not hasattr(os, "setpriority") or (pid is None and not sys.platform.startswith("linux")):
        return False
    who = pid if pid is not None else threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, who, min(19, os.getpriority(os.PRIO_PROCESS, who) + nice))
    except OSError:  # (not permitted, or the process is gone: nothing to slow down)
        return False
    return True


class BuildThreads:
    def __init__(self, n: int, name: str):
        self._max_workers = max(1, n)  # (ThreadPoolExecutor's name for it, which tests read)
        self.name = name
        self.jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self.threads: list = []
        self.procs: set = set()  # compiler processes running now (killed at exit)
        self.lock = threading.Lock()
        self.closed = False
        self.pid = os.getpid()  # a forked child inherits the atexit hook, not the threads or processes

    def submit(self, fn, *args) -> Future:
        fut = Future()
        with self.lock:
            if self.closed:  # (at exit: nothing new starts)
                fut.cancel()
                return fut
            self.jobs.put((fut, fn, args))
            if len(self.threads) < self._max_workers:
                t = threading.Thread(target=self._work, name=f"{self.name}-{len(self.threads)}", daemon=True)
                self.threads.append(t)
                t.start()
        return fut

    def _work(self):
        lower_priority()  # (this thread's compilers yield to the process's own calls)
        while True:
            fut, fn, args = self.jobs.get()
            if fut is None or not fut.set_running_or_notify_cancel():
                if fut is None:
                    return
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                fut.set_exception(exc)

    def run(self, cmd: list) -> subprocess.CompletedProcess:
        """``subprocess.run(cmd, capture_output=True, text=True)``, the process known to ``close``."""
        with self.lock:
            if self.closed:
                raise RuntimeError("ember is exiting: the build was cancelled")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.procs.add(proc)
        try:
            out, err = proc.communicate()
        finally:
            with self.lock:
                self.procs.discard(proc)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def close(self) -> None:
        """Cancel what is queued, kill the compilers running, let the threads stop (briefly)."""
        if os.getpid() != self.pid:  # the parent's pool, seen from a forked child: not ours to stop
            return
        with self.lock:
            self.closed = True
            procs = list(self.procs)
        while True:
            try:
                fut, _, _ = self.jobs.get_nowait()
            except queue.Empty:
                break
            fut.cancel()
        for p in procs:
            p.kill()
        for _ in self.threads:
            self.jobs.put((None, None, None))
        deadline = time.monotonic() + JOIN_AT_EXIT_S
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def start(n: int, name: str) -> BuildThreads:
    pool = BuildThreads(n, name)
    atexit.register(pool.close)
    return pool
