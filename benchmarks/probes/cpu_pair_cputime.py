"""Probe (issue 25, CPU, a loaded machine): eager vs ember on one cpu_suite workload in one process, steps
alternating, each step timed in this thread's CPU time (CLOCK_THREAD_CPUTIME_ID: user + system, page faults
included) beside wall time. At 1 thread, CPU time leaves out the time other processes hold the core, the
bulk of the noise when other jobs share the machine (their cache pressure stays). Also page faults per step.

    PYTHONPATH=. taskset -c 1 python benchmarks/probes/cpu_pair_cputime.py mlp_train [N=600] [QUICK=1]
"""
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

torch.set_num_threads(1)
import cpu_suite  # noqa: E402
import ember  # noqa: E402


def main(wl, n, quick):
    steps = []
    for wrap in (lambda f: f, ember.compile):
        torch.manual_seed(0)
        build, inputs, _ = cpu_suite.make(wl, quick)
        step = build(wrap)
        for _ in range(10):
            step(*inputs)
        steps.append((step, inputs))
    cpu, wall, faults = ([], []), ([], []), [0, 0]
    tc, pc = time.thread_time_ns, time.perf_counter_ns
    for i in range(n):
        for k in ((0, 1) if i % 2 else (1, 0)):
            s, a = steps[k]
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            w, c = pc(), tc()
            s(*a)
            cpu[k].append(tc() - c)
            wall[k].append(pc() - w)
            faults[k] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0

    def q(xs, p):
        return sorted(xs)[int(len(xs) * p)] / 1e3

    for what, xs in (("cpu", cpu), ("wall", wall)):
        print(f"{wl} {what}: eager p50 {q(xs[0], .5):8.1f} us p10 {q(xs[0], .1):8.1f} | ember p50 {q(xs[1], .5):8.1f} us"
              f" p10 {q(xs[1], .1):8.1f} | speedup p50 {q(xs[0], .5) / q(xs[1], .5):.3f} p10 {q(xs[0], .1) / q(xs[1], .1):.3f}"
              f" | per-pair median ratio {statistics.median(e / c for e, c in zip(*xs)):.3f}")
    print(f"{wl} faults/step: eager {faults[0] / n:.1f} ember {faults[1] / n:.1f}")


if __name__ == "__main__":
    main(sys.argv[1], int(os.environ.get("N", "600")), bool(os.environ.get("QUICK")))
