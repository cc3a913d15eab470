"""Probe: the Python that one call of a compiled function runs, on any machine (issue 28: host cost
per launch). Without a GPU, the native backend's Triton path is taken on CPU tensors
(TRITON_INTERPRET=1, EMBER_NATIVE_FORCE_TRITON=1) and, after the first call, every launch site's
fast path is given a stand-in for Triton's C launcher (``"".format``: a C call that takes any
arguments, as the real one does; no Python frame), so what is timed is ember's per-call Python:
entry, guards, the autograd layer's variant, the generated wrapper, ``Launch.__call__``. On a GPU
the real launcher runs.

Per workload: Python frames and C calls per call (``sys.setprofile``, each frame listed with
``--frames``) and the time per call (median of repeats of N back-to-back calls, spread = min..max).

    python benchmarks/probes/launch_path.py                       # overhead, mlp_grad, mlp_nograd
    python benchmarks/probes/launch_path.py --workloads overhead --frames
    python benchmarks/probes/launch_path.py --backend cpp         # CPU: ember's C++ kernels instead

Numbers on a shared CPU are noisy: compare two trees in alternating processes, not across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--workloads", default="overhead,mlp_grad,mlp_nograd")
ARGS.add_argument("--backend", default="triton", choices=("triton", "cpp", "eager", "none"),
                  help="triton: the native Triton path (stubbed launches without a GPU); cpp: the native C++ "
                       "path on CPU; eager: ember's eager backend; none: plain eager PyTorch")
ARGS.add_argument("--iters", type=int, default=20000)
ARGS.add_argument("--repeats", type=int, default=7)
ARGS.add_argument("--frames", action="store_true", help="list every frame and C call of one call")
OPTS = ARGS.parse_args()

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPU = False
if OPTS.backend == "triton":
    import torch
    GPU = torch.cuda.is_available()
    if not GPU:  # (before Triton is imported: its interpreter stands in for the first call)
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["EMBER_NATIVE_FORCE_TRITON"] = "1"

import torch  # noqa: E402

import ember  # noqa: E402

DEV = "cuda" if GPU else "cpu"


class _Launcher:
    """Triton 3.6's launcher object, its C ``launch`` a C no-op taking any arguments (``"".format``)."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, False
    launch = "".format


class _Kernel:
    """What ``JITFunction[grid](...)`` returns on a GPU, for ``Launch.adopt``."""
    function, packed_metadata = 0, (1, 1, 0)
    run = _Launcher()


class _Driver:
    get_current_device = staticmethod(int)  # (int() == 0)
    get_current_stream = staticmethod(int)  # a C call, as torch._C._cuda_getCurrentRawStream


def stub_launches() -> None:
    """No GPU: each launch site runs its kernel in the interpreter at its first call, then adopts a
    stand-in compiled kernel through ``Launch.adopt`` as on a GPU (the alignment checks of the first
    call's pointers, the direct C launcher), so later calls take ember's real fast path."""
    from triton.runtime import driver

    from ember.native import runtime
    driver.set_active(_Driver())

    def first_locked(self, args):
        self._slow(args)  # (the interpreter runs the kernel once: outputs are right at the first call)
        checks = tuple((i, (a.data_ptr() & 15) == 0) for i, a in enumerate(args)
                       if hasattr(a, "data_ptr") and i not in self.fresh)
        self.adopt(_Kernel(), checks, len(args))

    runtime.Launch._first_locked = first_locked


def workload(name: str):
    torch.manual_seed(0)
    if name == "overhead":  # gpu_suite's row: x * 2 + 1 on 16 floats, grad mode on
        def f(x):
            return x * 2 + 1
        return f, (torch.randn(16, device=DEV),), False
    if name.startswith("mlp"):  # gpu_suite's mlp at a small size (the interpreter runs its first call)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128),
                                torch.nn.GELU(), torch.nn.Linear(128, 10)).to(DEV).eval()
        return m, (torch.randn(4, 64, device=DEV),), name.endswith("nograd")
    raise SystemExit(f"unknown workload {name}")


def count_frames(step):
    order = []

    def prof(frame, event, arg):
        if event == "call":
            c = frame.f_code
            order.append(f"{os.path.basename(c.co_filename)}:{c.co_firstlineno} {c.co_name}")
        elif event == "c_call":
            order.append(f"C {getattr(arg, '__qualname__', arg)}")
    sys.setprofile(prof)
    step()
    sys.setprofile(None)
    order = order[:-1]  # (setprofile itself)
    return order


def measure(name: str) -> dict:
    fn, inputs, nograd = workload(name)
    backend = {"triton": "ember", "cpp": "ember", "eager": "eager"}.get(OPTS.backend)
    step_fn = fn if backend is None else ember.compile(fn, backend=backend)
    if nograd:
        def step():
            with torch.no_grad():
                return step_fn(*inputs)
    else:
        def step():
            return step_fn(*inputs)
    ref = fn(*inputs)
    out = step()
    err = (out.float() - ref.float()).abs().max().item()  # (the first call: real kernels, interpreted)
    for _ in range(200):
        step()
    order = count_frames(step)
    times, cpu = [], []
    for _ in range(OPTS.repeats):
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(OPTS.iters):
            step()
        if GPU:
            torch.cuda.synchronize()
        times.append((time.perf_counter_ns() - t) / OPTS.iters / 1e3)
        cpu.append((time.thread_time_ns() - c) / OPTS.iters / 1e3)
    rec = dict(workload=name, backend=OPTS.backend, first_call_max_err=err,
               python_frames=sum(not o.startswith("C ") for o in order),
               c_calls=sum(o.startswith("C ") for o in order),
               us_per_call=round(statistics.median(times), 3), us_min=round(min(times), 3),
               us_max=round(max(times), 3),
               # this thread's CPU time per call: less disturbed than wall time on a shared machine
               cpu_us_per_call=round(statistics.median(cpu), 3), cpu_us_min=round(min(cpu), 3))
    if OPTS.frames:
        rec["frames"] = order
    return rec


def main() -> None:
    if OPTS.backend == "triton" and not GPU:
        stub_launches()
    if OPTS.backend == "cpp":
        ember.config.native_cpu = "cpp"
    torch.set_num_threads(1)
    for name in OPTS.workloads.split(","):
        print(json.dumps(measure(name)), flush=True)


if __name__ == "__main__":
    main()
