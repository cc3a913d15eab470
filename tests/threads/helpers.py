"""What the thread tests share: threads released together by a barrier, and a fixture that makes the
interpreter switch threads as often as it can (so interleavings happen in a short test)."""
import sys
import threading

import pytest


def run_threads(n, work):
    """Run work(i) in n threads released together; re-raise the first error; return the results."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def body(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)
