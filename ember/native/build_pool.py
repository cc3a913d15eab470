"""Worker processes that build Triton kernels in parallel (the worker side: ``build_worker.py``).

The pool starts when the native backend generates its first graph on a machine with a GPU
(``runtime.want_builds``), so the workers import Triton while that graph is lowered and emitted; a
process whose graphs all come from the disk cache (a warm start) never starts it. ``precompile`` in ``runtime`` hands it every kernel a graph still needs: each request is
the kernel module's path and the specialization Triton's ``jit_cache_hook`` reports for the build
the parent is about to do, so a worker computes the same cache key and writes the binary (and its C
launcher) where the parent's own build then finds it. Batches are built in the background while
the parent goes on (a training step's backward graph is generated while the forward's kernels
build); a kernel's first launch waits for them (``wait``), then builds the kernel itself through
Triton's normal path, a cache hit. So a worker that fails, dies or keys a build differently costs
time, never correctness; ``STATS`` counts each case.

``EMBER_COMPILE_THREADS=1`` turns the pool off (each kernel is then built at its first launch).
"""
from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time

from ember.native import build_threads, build_worker, triton_cache
from ember.config import environment

STATS = {"submitted": 0, "built": 0, "failed": 0, "launchers": 0, "key_mismatch": 0, "worker_deaths": 0, "stalls": 0,
         "worker_s": 0.0, "slowest_s": 0.0, "wait_s": 0.0}
STALL_S = 600.0  # no answer from any busy worker for this long: give up on the pool
POOL_MIN_KERNELS = 4  # fewer builds wait for no starting worker: this process builds them (threads)
_POOL: "BuildPool | None" = None
_PENDING: list = []  # (thread, ids of its launch sites) of the batches being built
_LAUNCHERS: set = set()  # kernel signatures whose C launcher a worker has been asked to build
_LOCK = threading.Lock()


class BuildPool:
    """Workers answer one JSON line per message. Their pipes are read with ``os.read`` into a buffer
    per worker, never through Python's buffered readers: a reader that took two lines at once
    would leave the second in its buffer, where ``select`` cannot see it (a worker still starting
    writes "ready" and, a cache hit later, its first answer: the two often arrive together)."""

    def __init__(self, n: int):
        self.lock = threading.Lock()  # one batch at a time (each worker holds one request)
        self.procs = [self._spawn() for _ in range(n)]
        self.ready: set = set()  # workers that have said they have imported Triton
        self.pending = {p: b"" for p in self.procs}  # bytes read past the last complete line

    @staticmethod
    def _spawn():
        p = subprocess.Popen([sys.executable, os.path.abspath(build_worker.__file__)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             bufsize=0, close_fds=True, env=triton_cache.worker_env())
        # (it imports Triton for ~0.3 s before its first build: lowered well before it starts ptxas)
        if isinstance(getattr(p, "pid", None), int):  # (never None: that would lower this thread)
            build_threads.lower_priority(p.pid)
        return p

    def alive(self) -> list:
        return [p for p in self.procs if p.poll() is None]

    def _messages(self, p):
        """The complete messages ``p`` has sent (call when its pipe is readable); None at its end."""
        chunk = os.read(p.stdout.fileno(), 1 << 16)
        if not chunk:
            return None
        *lines, self.pending[p] = (self.pending[p] + chunk).split(b"\n")
        out = []
        for line in lines:
            msg = json.loads(line)
            if "ready" in msg:
                self.ready.add(p)
            else:
                out.append(msg)
        return out

    def n_ready(self) -> int:
        """How many workers are up (reads their "ready" lines without waiting). While a batch is
        being built the workers are evidently in use: at least 1."""
        up = len([p for p in self.ready if p.poll() is None])
        if up or not self.lock.acquire(blocking=False):
            return max(up, 1)
        try:
            waiting = [p for p in self.alive() if p not in self.ready]
            if waiting:
                with selectors.DefaultSelector() as sel:
                    for p in waiting:
                        sel.register(p.stdout, selectors.EVENT_READ, p)
                    for key, _ in sel.select(timeout=0):
                        self._messages(key.data)  # (only "ready" lines: no request is out)
            return len([p for p in self.ready if p.poll() is None])
        finally:
            self.lock.release()

    def build(self, jobs: list) -> dict:
        """Run ``jobs`` (dicts with an ``id``) on the workers; {id: the worker's answer}. Returns when
        every job is answered, every worker has died (their jobs are left unanswered), or no worker
        has answered for ``STALL_S`` (the pool is then shut down: this process builds the rest).
        A worker still starting takes its first job when it is up."""
        results: dict = {}
        with self.lock:
            queue, busy = list(reversed(jobs)), {}
            sel = selectors.DefaultSelector()

            def feed(p):
                if queue:
                    job = queue.pop()
                    try:
                        data = memoryview((json.dumps(job) + "\n").encode())
                        while data:  # (an unbuffered pipe may take a long request in parts)
                            data = data[p.stdin.write(data):]
                        busy[p] = job
                    except OSError:  # died before its request: put the job back for another worker
                        queue.append(job)
                        sel.unregister(p.stdout)

            for p in self.alive():
                sel.register(p.stdout, selectors.EVENT_READ, p)
                feed(p)
            last = time.monotonic()
            while busy:
                events = sel.select(timeout=10)
                if not events and time.monotonic() - last > STALL_S:
                    STATS["stalls"] += 1
                    self.close()
                    break
                for key, _ in events:
                    p = key.data
                    msgs = self._messages(p)
                    if msgs is None:  # the worker died (with its request, if it had one: the parent builds it)
                        STATS["worker_deaths"] += 1
                        busy.pop(p, None)
                        sel.unregister(p.stdout)
                        continue
                    for res in msgs:
                        last = time.monotonic()
                        busy.pop(p, None)
                        results[res["id"]] = res
                        feed(p)
            sel.close()
        return results

    def close(self):
        for p in self.procs:
            try:
                p.stdin.close()  # a worker exits at the end of its input
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()


def start(n: int) -> "BuildPool | None":
    """The process's pool, started with ``n`` workers on first use; None when ``n <= 1`` or under the
    Triton interpreter (nothing to build)."""
    global _POOL
    if n <= 1 or environment.triton_interpret:
        return None
    with _LOCK:
        if _POOL is None:
            triton_cache.ensure_safe()  # (the workers get the checked directories: worker_env)
            try:  # (one core left to this process, which generates code meanwhile)
                _POOL = BuildPool(min(n, max(2, (os.cpu_count() or 2) - 1)))
            except OSError:  # no processes to be had: builds stay in this process
                return None
            atexit.register(_POOL.close)
        return _POOL


def get() -> "BuildPool | None":
    return _POOL


# ------------------------------------------------------------------------------- the parent's side

def specializations(sites) -> list:
    """(site, request) for every launch site whose kernel is not built yet: what Triton would build
    for the site's first call, captured by ``jit_cache_hook`` (which also stops the build)."""
    from triton import knobs
    from triton.runtime import driver
    captured: list = []

    def hook(*, compile, **_):
        captured.append(compile["specialization_data"])
        return True  # skip the build here

    sites = [s for s in sites if hasattr(s.fn, "device_caches")]  # JITFunctions (not a test's stand-in)
    if not sites:
        return []
    from ember.native import runtime
    prewarm = runtime._DRIVER_PREWARM
    if prewarm and prewarm.is_alive():  # (Triton's driver, read below: not created twice at once, two C compiles)
        prewarm.join()
    try:
        t = driver.active.get_current_target()
    except Exception:  # noqa: BLE001 - no usable driver: nothing for the pool
        return []
    target = [t.backend, t.arch, t.warp_size]
    out, seen = [], {}
    old, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
    try:
        for site in sites:
            captured.clear()
            try:
                site.fn.warmup(*site.spec, grid=site.grid, **site.meta)
                mod = sys.modules.get(site.fn.fn.__module__)  # (a JITFunction's Python function)
            except Exception:  # noqa: BLE001 - the parent's own build reports it
                continue
            if not captured or getattr(mod, "__file__", None) is None:
                continue
            req = dict(path=mod.__file__, module=mod.__name__, name=site.fn.fn.__name__, spec=captured[-1],
                       target=target, digest=getattr(mod, "__ember_sha256__", None))
            ident = (req["path"], req["name"], req["spec"])
            if ident not in seen:
                # a launcher's C source depends on the argument types only: one build per signature
                sig = tuple(json.loads(req["spec"])["signature"].values())
                seen[ident] = req = dict(req, id=len(seen), launcher=sig not in _LAUNCHERS,
                                         cost=len(getattr(site.fn, "src", "")))
                _LAUNCHERS.add(sig)
                out.append((site, req))
            else:
                out.append((site, seen[ident]))
    finally:
        knobs.runtime.jit_cache_hook = old
    return out


def build_ahead(sites) -> bool:
    """Start building the kernels of ``sites`` on the pool, in a background thread, and return: the
    caller goes on (the next graph's code generation overlaps these builds) and ``wait()`` before a
    first launch. Each site gets ``ahead``: the Triton cache hash its worker built. False (nothing
    started) without a running pool, or for a few kernels while no worker is up yet (a worker starts
    in ~0.3 s, Triton's import; a small first graph may be ready before that)."""
    pool = get()
    if pool is None or not pool.alive() or (len(sites) < POOL_MIN_KERNELS and pool.n_ready() == 0):
        return False
    pairs = specializations(sites)
    # longest source first: the slowest build (ptxas on a large fused kernel, ~1.7 s) is what a
    # first launch ends up waiting for, so it must not start last
    jobs = sorted({req["id"]: req for _, req in pairs}.values(), key=lambda r: -r["cost"])
    if not jobs:
        return False
    STATS["submitted"] += len(jobs)

    def run():
        key = _parent_key()
        results = pool.build([dict(job, triton_key=key) for job in jobs] if key else jobs)
        for site, req in pairs:
            res = results.get(req["id"])
            if res is not None and res.get("ok"):
                site.ahead = res.get("hash")
        for res in results.values():
            STATS["built" if res.get("ok") else "failed"] += 1
            STATS["launchers"] += bool(res.get("launcher"))
            STATS["worker_s"] = round(STATS["worker_s"] + res.get("s", 0.0), 3)
            STATS["slowest_s"] = max(STATS["slowest_s"], res.get("s", 0.0))
    t = threading.Thread(target=run, name="ember-build-pool", daemon=True)
    t.start()
    _PENDING.append((t, {id(site) for site, _ in pairs}))
    return True


def _parent_key() -> str | None:
    """This process's Triton cache key, for the workers (``build_worker._take_key``): from the thread
    computing it since the frame's trace began (``runtime.prewarm_triton_key``), waited for here,
    in the batch's thread, not before the batch is prepared. None if it cannot be had."""
    from ember.native import runtime
    try:
        if runtime._PREWARM:
            runtime._PREWARM.join()
        from triton.runtime.cache import triton_key
        return triton_key()
    except Exception:  # noqa: BLE001 - the workers compute their own
        return None


def wait(site=None) -> None:
    """Until the batch building ``site``'s kernel is done (called before its first launch), or every
    batch handed to the pool (no ``site``). Batches run one after another, in the order the graphs
    were compiled: a forward's first launch need not wait for its backward's kernels."""
    if not _PENDING:
        return
    t0 = time.perf_counter()
    for entry in list(_PENDING):
        thread, ids = entry
        if site is None or id(site) in ids:
            thread.join()
        if not thread.is_alive() and entry in _PENDING:
            _PENDING.remove(entry)
    STATS["wait_s"] = round(STATS["wait_s"] + time.perf_counter() - t0, 3)
