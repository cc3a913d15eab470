"""One compiled function called from several threads at once: every result equals eager, stays intact
while later calls run (in the same thread or another), and no partition gives up on OpenVINO.

An infer request runs one inference at a time; when threads shared one, OpenVINO raised "Infer
Request is busy" (and the partition silently fell back to PyTorch for good) or one thread's results
came out of another's inputs. Each partition now keeps a free list of requests (runtime.py)."""
import threading

import pytest

from tests.openvino.conftest import require_openvino  # noqa: E402

require_openvino()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ember  # noqa: E402
from ember.backends.openvino import runtime  # noqa: E402
from tests.openvino.helpers import F32  # noqa: E402

THREADS, CALLS = 4, 100


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).eval()


class Mixed(nn.Module):
    """Two OpenVINO partitions with a PyTorch op between them (relu is disabled below): the
    single-threaded-PyTorch wrapper (threads.py) and partition-to-partition buffers under threads."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        return torch.tanh(self.b(torch.relu(torch.sin(self.a(x)))))


CASES = {  # name: (model, backend, options, dynamic)
    "one partition": (mlp, "openvino", F32, False),
    "partitions around a PyTorch op": (lambda: Mixed().eval(), "openvino", dict(F32, disabled_ops=["aten.relu"]),
                                       False),
    "dynamic sizes": (mlp, "openvino", F32, True),
    "openvino_ts": (mlp, "openvino_ts", F32, False),
}


@pytest.fixture
def fallbacks(monkeypatch):
    """Reasons of every partition that switched to PyTorch during the test."""
    seen = []
    original = runtime.OVPartition.use_fallback

    def record(self, reason):
        seen.append(reason)
        original(self, reason)

    monkeypatch.setattr(runtime.OVPartition, "use_fallback", record)
    return seen


@pytest.fixture
def request_count(monkeypatch):
    """How many OpenVINO infer requests were created during the test."""
    import openvino as ov
    created = []  # the compiled model of each, by id
    original = ov.CompiledModel.create_infer_request

    def counting(self, *args, **kwargs):
        created.append(id(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ov.CompiledModel, "create_infer_request", counting)
    return created


@pytest.mark.parametrize("case", list(CASES))
def test_threads_share_a_compiled_function(case, fallbacks, request_count):
    make, backend, options, dynamic = CASES[case]
    torch.manual_seed(0)
    model = make()
    compiled = ember.compile(model, backend=backend, options=options, dynamic=dynamic)
    rows = [3, 5, 7, 9] if dynamic else [8] * THREADS
    inputs = [torch.randn(n, 32) for n in rows]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
        for x in inputs:
            compiled(x)  # compile (and, for dynamic, see every size) before the threads start
    partitions = len(set(request_count))
    assert partitions >= 1
    results = [[] for _ in range(THREADS)]
    errors = []

    def work(t):
        try:
            with torch.no_grad():
                for _ in range(CALLS):
                    results[t].append(compiled(inputs[t]))  # every result is kept: none may be overwritten
        except Exception as exc:  # noqa: BLE001 - reported below, with the thread
            errors.append((t, exc))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert not fallbacks, fallbacks
    for t in range(THREADS):
        assert len(results[t]) == CALLS
        for k, got in enumerate(results[t]):
            torch.testing.assert_close(got, expected[t], rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"thread {t} call {k}: {m}")
    # requests are pooled, not made per call: at most one per thread per partition
    assert len(request_count) <= partitions * THREADS, len(request_count)


def test_outputs_held_in_one_thread_survive_calls_in_another(fallbacks):
    """A result handed to one thread is not reused as a buffer by the calls of another."""
    torch.manual_seed(0)
    model = mlp()
    compiled = ember.compile(model, backend="openvino", options=F32)
    x, other = torch.randn(8, 32), torch.randn(8, 32)
    with torch.no_grad():
        held = compiled(x)
        expected = model(x)
        worker = threading.Thread(target=lambda: [compiled(other) for _ in range(20)])
        worker.start()
        worker.join()
    torch.testing.assert_close(held, expected, rtol=1e-4, atol=1e-5)
    assert not fallbacks
