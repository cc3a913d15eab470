"""Build the Triton kernels of generated graphs for an H100 (sm_90) on this CPU, no GPU: seconds per
kernel, Triton's whole pipeline including ptxas (not the C launcher, which needs libcuda) (issue 29 probe: which kernels are the slow builds
of a cold compile, and what a scheduling change does to them).

    python benchmarks/probes/fusion_size.py llama_train --keep /tmp/ll      # generate (Triton source)
    python benchmarks/probes/cpu_kernel_builds.py /tmp/ll                    # build each distinct kernel

The argument: an ember cache directory (every ``native/graphs/*/*.py`` wrapper in it) or one wrapper
file. Each launch site's kernel is built once, as the build pool's workers do (``build_worker``: a
driver that answers "which target" only), with the specialization of the site's ``spec`` (every
pointer 16-byte aligned), in one process, one after another, into a fresh Triton cache. Triton's
own cache key (``triton_key``) is computed first, as a worker does before its first request.
Absolute seconds depend on this CPU (and on what else runs: use the CPU timing lock); the ratio
between kernels is what carries over to the H100 host, whose workers build ~16 at once.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
import time

LAUNCH = re.compile(r"^launch\d+ = Launch\((\w+), (\([^)]*\)), (\{[^}]*\}), fresh=\([^)]*\), spec=(\(.*\))\)$", re.M)
LOAD = re.compile(r"^(\w+) = load_kernel\('([^']+)', '\w+'\)", re.M)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("path", help="ember cache directory or one wrapper (graph) file")
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--only", default=None, help="kernels whose name contains this")
    a = p.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        del os.environ["TRITON_INTERPRET"]  # (before triton is imported: real builds)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="cpu_kernel_builds_")
    import torch
    from triton.runtime import driver
    from triton.runtime.cache import triton_key
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    from ember.native import build_worker as bw

    class Target(bw.TargetDriver):
        def get_current_stream(self, *_):  # (asked by warmup; nothing is launched)
            return 0
    driver.set_active(Target("cuda", a.arch, 32))
    triton_key()
    wrappers = [a.path] if os.path.isfile(a.path) else sorted(glob.glob(os.path.join(a.path, "native", "graphs", "*", "*.py")))
    built, rows = set(), []
    for w in wrappers:
        src = open(w).read()
        paths = dict(LOAD.findall(src))
        for m in LAUNCH.finditer(src):
            name = m.group(1)
            if (paths.get(name), name) in built or (a.only and a.only not in name):
                continue
            built.add((paths.get(name), name))
            grid, meta = eval(m.group(2)), eval(m.group(3))  # noqa: S307 - our own generated wrapper
            spec = eval(m.group(4), {"torch": torch})  # noqa: S307
            fn = getattr(bw.load_kernel_module(paths[name]), name)
            t = time.perf_counter()
            try:
                kernel = fn.warmup(*spec, grid=grid, **meta)
            except Exception as e:  # noqa: BLE001 - reported, next kernel
                print(f"  error {name}: {type(e).__name__}: {str(e)[:200]}")
                continue
            s = time.perf_counter() - t
            rows.append((s, len(fn.src), name, os.path.basename(w)[:8]))
    rows.sort(key=lambda r: -r[0])
    total = sum(r[0] for r in rows)
    print(f"{len(rows)} kernels built for sm_{a.arch} on this CPU in {total:.2f} s (one at a time); slowest first:")
    for s, chars, name, graph in rows:
        print(f"  {s:7.3f} s  {chars:6d} chars  graph {graph}  {name}")


if __name__ == "__main__":
    main()
