"""Kernel builds in worker processes (ember/native/build_pool.py): a worker must key its build as the
parent does, so the parent's own build is a disk-cache hit; a failing or dead worker costs time, not
correctness. Checked for sm_90 without a GPU, in a subprocess without TRITON_INTERPRET
(build_pool_check.py)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))


def test_workers_build_what_the_parent_then_finds_in_the_cache():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, os.path.join(HERE, "build_pool_check.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    stats = res["stats"]
    # five distinct builds (one site repeats another) + one after a worker was killed (+ 4 again)
    assert res["submitted"] == 6 and stats["submitted"] == 10, res
    assert stats["built"] == 9 and stats["failed"] == 1, res  # the broken kernel fails in its worker
    assert res["broken_ahead"] is None, res
    assert res["same"] == [True] * 5, res  # the parent's builds have the workers' hashes...
    assert res["binaries"] == 4, res  # ...and added no binary
    assert res["late"] == [True, True] and res["alive"] == 1, res  # the surviving worker took the late one
    assert res["again"] == [True] * 6, res  # a starting pool's answers to cache hits (no hang)


def test_no_pool_for_one_thread_or_the_interpreter(monkeypatch):
    from ember.native import build_pool
    monkeypatch.setattr(build_pool, "_POOL", None)
    assert build_pool.start(1) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert build_pool.start(8) is None and build_pool.get() is None


# a worker that answers its first request in the same write as its "ready" line
_ECHO = ("import json, sys\n"
         "req = json.loads(sys.stdin.readline())\n"
         "sys.stdout.write('{\"ready\": true}\\n' + json.dumps({'id': req['id'], 'ok': True}) + '\\n')\n"
         "sys.stdout.flush()\n"
         "sys.stdin.read()\n")


def test_two_messages_in_one_read_are_both_seen(monkeypatch):
    """A buffered reader that took both lines at once would leave the answer where select cannot
    see it, and the batch would never end (seen on the H100: a process that found every kernel in
    the disk cache hung at its first call)."""
    import subprocess
    import threading

    from ember.native import build_pool
    monkeypatch.setattr(build_pool.BuildPool, "_spawn", staticmethod(lambda: subprocess.Popen(
        [sys.executable, "-c", _ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)))
    pool = build_pool.BuildPool(1)
    out = {}
    t = threading.Thread(target=lambda: out.update(pool.build([{"id": 7}])), daemon=True)
    t.start()
    t.join(timeout=30)
    pool.close()
    assert not t.is_alive() and out == {7: {"id": 7, "ok": True}}
    assert pool.ready == set(pool.procs)


def test_a_first_launch_waits_only_for_its_own_batch(monkeypatch):
    # a forward's kernels must not wait for the backward's batch, built after it
    import threading

    from ember.native import build_pool
    release = threading.Event()
    fw_site, bw_site = object(), object()
    fw = threading.Thread(target=lambda: None)
    bw = threading.Thread(target=release.wait)
    fw.start()
    bw.start()
    monkeypatch.setattr(build_pool, "_PENDING", [(fw, {id(fw_site)}), (bw, {id(bw_site)})])
    build_pool.wait(fw_site)
    assert bw.is_alive() and [e[0] for e in build_pool._PENDING] == [bw]
    release.set()
    build_pool.wait(bw_site)
    assert build_pool._PENDING == []
    build_pool.wait()  # nothing pending: returns at once


def test_a_worker_loads_kernels_without_torch_or_the_ember_package(tmp_path):
    """A build worker imports a generated kernel module, its helpers (triton_helpers), the cache policy
    (diskcache) and ember's matmul kernel by path: never torch or the ember package, whose import costs
    seconds in every worker (it once made every build on the H100 ~8 s and warm starts as slow as cold)."""
    from ember.native import cache
    src = ("import triton\nimport triton.language as tl\nfrom ember.native.triton_helpers import *  # noqa\n\n\n"
           "@triton.jit\ndef k(x_ptr, XBLOCK: tl.constexpr):\n    tl.store(x_ptr + tl.arange(0, XBLOCK), 1.0)\n")
    path = cache.write_source("kernels", src, base=str(tmp_path))
    mm = os.path.join(os.path.dirname(cache.__file__), "mm_kernel.py")
    probe = (f"import sys, os\nsys.path.insert(0, {os.path.dirname(cache.__file__)!r})\nimport build_worker as bw\n"
             f"bw.load_kernel_module({path!r}, None, digest={os.path.basename(path)[:-3]!r})\n"
             f"bw.load_kernel_module({mm!r}, 'ember.native.mm_kernel')\n"
             "print(sorted(m for m in sys.modules if m == 'torch' or m == 'ember' or m.startswith(('torch.', 'ember.'))))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "['ember.diskcache', 'ember.native.mm_kernel', 'ember.native.triton_helpers']", out.stdout


def test_a_batch_for_the_pool_does_not_wait_for_the_parents_triton_key(monkeypatch):
    """Triton's cache key (a hash of 0.4 GB, ~0.4 s, more when a dozen workers hash it at once) is
    computed in a thread from the frame's trace on; ``precompile`` waited for it before handing a
    graph's kernels to the pool, which needs it only when the requests go out (in the batch's own
    thread): the cold first call of the H100's one-kernel rows waited 0.36 s there."""
    import threading

    from ember.native import build_pool, runtime
    release = threading.Event()
    hashing = threading.Thread(target=release.wait, daemon=True)
    hashing.start()
    monkeypatch.setattr(runtime, "_PREWARM", hashing)
    handed = []
    monkeypatch.setattr(build_pool, "build_ahead", lambda todo: handed.append(todo) or True)

    class Site:
        spec, fast = (), None
    done = threading.Thread(target=runtime.precompile, args=([Site()], 8), daemon=True)
    done.start()
    done.join(timeout=20)
    alive = done.is_alive()
    release.set()
    assert not alive and len(handed) == 1


def test_requests_carry_the_parents_triton_key(monkeypatch):
    """The workers build under the parent's Triton cache key (sent with each request) instead of
    hashing Triton's sources each (``build_worker._take_key``); the batch's thread waits for it."""
    import threading

    from ember.native import build_pool, runtime
    sent = []

    class Pool:
        def alive(self):
            return [1]

        def n_ready(self):
            return 1

        def build(self, jobs):
            sent.extend(jobs)
            return {}
    release = threading.Event()
    hashing = threading.Thread(target=release.wait, daemon=True)
    hashing.start()
    monkeypatch.setattr(runtime, "_PREWARM", hashing)
    monkeypatch.setattr(build_pool, "_POOL", Pool())
    monkeypatch.setattr(build_pool, "_PENDING", [])
    monkeypatch.setattr(build_pool, "specializations", lambda sites: [(s, dict(id=0, cost=1)) for s in sites])
    import triton.runtime.cache as tcache
    monkeypatch.setattr(tcache, "triton_key", lambda: "the-parents-key")
    assert build_pool.build_ahead([object()] * 4)
    thread = build_pool._PENDING[0][0]
    thread.join(timeout=0.5)
    assert thread.is_alive() and not sent  # (waiting for the parent's hash)
    release.set()
    thread.join(timeout=20)
    assert [j.get("triton_key") for j in sent] == ["the-parents-key"]


def test_a_worker_builds_under_the_key_it_is_given():
    """A worker takes the key of its requests (``_take_key``) and says it is ready before hashing
    anything (its "ready" used to wait for its own hash of Triton's sources)."""
    here = os.path.join(os.path.dirname(HERE), "..", "ember", "native")
    probe = (f"import sys\nsys.path.insert(0, {os.path.abspath(here)!r})\nimport build_worker as bw\n"
             "import triton.runtime.cache as c\n"
             "calls = []\n"
             "real = c.triton_key\n"
             "c.triton_key = lambda: calls.append(1) or real()\n"
             "bw._take_key('k1')\nprint(c.triton_key(), c.get_cache_key.__globals__['triton_key']())\n"
             "bw._take_key('k1')\nk = c.triton_key\nbw._take_key('k1')\nprint(k is c.triton_key, calls)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["k1 k1", "True []"], out.stdout


def test_a_launcher_started_before_the_build_is_the_one_the_build_needs(tmp_path):
    """A worker starts the kernel's C launcher as the build begins (``_launcher_ahead``), from the
    specialization's signature and constants, instead of after the build: its C source must be the
    one Triton makes from the built kernel (the parent's first launch finds it in the cache by
    that source's hash). Built for sm_90 without a GPU; the C compiler is replaced by a recorder."""
    from ember.native import cache
    src = ("import triton\nimport triton.language as tl\nfrom ember.native.triton_helpers import *  # noqa\n\n\n"
           "@triton.jit\ndef k(x_ptr, y_ptr, n, XBLOCK: tl.constexpr):\n"
           "    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
           "    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)\n")
    path = cache.write_source("kernels", src, base=str(tmp_path))
    probe = f"""import os, sys
os.environ["TRITON_CACHE_DIR"] = {str(tmp_path / "triton")!r}
sys.path.insert(0, {os.path.dirname(cache.__file__)!r})
import torch
import build_worker as bw
from triton import knobs
from triton.runtime import driver
import triton.backends.nvidia.driver as nd

class D(bw.TargetDriver):
    def get_current_stream(self, *_):
        return 0
driver.set_active(D("cuda", 90, 32))
seen = []
def recorder(src, **kw):
    seen.append(src)
    raise RuntimeError("recorded")
nd.compile_module_from_src = recorder
nd.library_dirs = lambda: []  # (asks for libcuda, absent here)
fn = bw.load_kernel_module({path!r}, None, digest={os.path.basename(path)[:-3]!r}).k
early = []
knobs.runtime.jit_cache_hook = bw._launcher_ahead(early)
x = torch.empty(64)
kernel = fn.warmup(x, x, 37, grid=(1,), XBLOCK=64)
early[0].join()
try:
    nd.CudaLauncher(kernel.src, kernel.metadata)
except RuntimeError:
    pass
print(len(seen), seen[0] == seen[1], "recorded" in early[1].get("launcher_error", ""), "x_ptr" not in seen[0])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "2 True True True", out.stdout


def test_triton_keys_hash_runs_with_a_short_switch_interval(monkeypatch):
    """The thread hashing Triton (``prewarm_triton_key``) asks for the GIL back once per MiB; with
    Python's default 5 ms switch interval a main thread busy tracing made it wait 400 times (the key
    was ready 0.3 s after the main thread went idle on the H100). The interval is short while it
    hashes, and restored after."""
    import sys

    import triton.runtime.cache as tcache

    from ember.native import runtime
    seen = []
    monkeypatch.setattr(tcache, "triton_key", lambda: seen.append(sys.getswitchinterval()))
    monkeypatch.setattr(runtime, "_PREWARM", None)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    before = sys.getswitchinterval()
    runtime.prewarm_triton_key()
    runtime._PREWARM.join(timeout=20)
    assert seen == [pytest.approx(runtime.HASH_SWITCH_INTERVAL_S)] and sys.getswitchinterval() == before
