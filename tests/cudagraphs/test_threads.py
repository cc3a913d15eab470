"""The CUDA-graph runner called from several threads at once, on the fake graph API (fake_cuda.py):
every result equals eager. A replay reads and writes fixed memory shared by all callers, so without
the runner's lock one thread's inputs land in another thread's replay (wrong values)."""

import pytest
import torch

import ember.cudagraphs as cg
from tests.threads.helpers import fast_switching, run_threads  # noqa: F401 - a fixture

N_THREADS, N_CALLS = 6, 40


def mlp(x, w, b):
    return ((x @ w + b).relu() * 2,)


def hammer(work, n=N_THREADS):
    run_threads(n, work)


def test_threads_sharing_one_runner_get_their_own_results(fake, fast_switching):
    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))
    run = cg.cudagraphify(mlp, None, [], api=fake)
    with torch.no_grad():
        run(torch.randn(3, 8), w, b)  # warm-up and recording happen before the threads start
        run(torch.randn(3, 8), w, b)
    assert fake.captures == 1

    def work(i):
        with torch.no_grad():
            for _ in range(N_CALLS):
                x = torch.randn(3, 8) + i  # each thread's own values: a mix-up shows
                (out,) = run(x, w, b)
                torch.testing.assert_close(out, mlp(x, w, b)[0])
                del out

    hammer(work)
    assert cg.stats()["replays"] > 0


def test_threads_warming_up_and_recording_at_once(fake, fast_switching):
    """Threads reach the first calls (warm-up, capture) together, with two input shapes."""
    w, b = torch.randn(8, 4), torch.randn(4)
    run = cg.cudagraphify(mlp, None, [], api=fake)

    def work(i):
        for k in range(N_CALLS):
            x = torch.randn(2 + (i + k) % 2, 8) - i
            (out,) = run(x, w, b)
            expected = mlp(x, w, b)[0]
            torch.testing.assert_close(out, expected)
            del out

    hammer(work)
    s = cg.stats()
    # outputs held by one thread while another calls make re-recordings (up to the limit): allowed,
    # but never a failed capture (one thread's ops inside another's capture)
    assert s["recordings"] >= 1 and not any("capture failed" in d for d in s["disabled"])


def test_threads_with_several_runners_sharing_a_pool(fake, fast_switching):
    """Two graphs of one device (one pool), the second consuming the first's output, per thread."""
    w1, w2 = torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8, 4))
    first = cg.cudagraphify(lambda x, w: ((x @ w).tanh(),), None, [], api=fake)
    second = cg.cudagraphify(lambda h, w: ((h @ w) + 1,), None, [], api=fake)

    def work(i):
        with torch.no_grad():
            for _ in range(N_CALLS):
                x = torch.randn(4, 8) * (i + 1)
                (h,) = first(x, w1)
                (y,) = second(h, w2)
                torch.testing.assert_close(y, (x @ w1).tanh() @ w2 + 1)
                del h, y

    hammer(work)
