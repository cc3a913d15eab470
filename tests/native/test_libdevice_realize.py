"""A small value computing a libdevice op (ops.LIBDEVICE: sin, cos, tanh, erf...) that several nodes
read is stored once (lowering.GraphLowering.REALIZE_LIBDEVICE_NUMEL) instead of recomputed in each
kernel that reads it: each inlined copy costs that kernel's build ~0.1 s of libdevice code per call
(a Llama's rotary cos/sin table, recomputed in 2 kernels per layer). Outputs match eager."""
import torch

from ember.native import ir, lowering
from ember.native.backend import DEFAULT_OPTIONS, plan
from tests.native.harness import DEVICE, run_case, trace


def rope_like(x, w, t):
    """A table (cos of t) read by two kernels an extern call separates: before and after x @ w."""
    c = torch.cos(t)
    a = x * c
    return a, (a @ w) * c


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(16, 8, device=DEVICE), torch.randn(8, 8, device=DEVICE), torch.randn(16, 8, device=DEVICE)]


def _kernels_computing_cos(inputs):
    _, _, sched, _ = plan(trace(rope_like, inputs), inputs, dict(DEFAULT_OPTIONS))
    kernels = [s for s in sched.steps if hasattr(s, "bodies")]
    return sum(1 for k in kernels if any(e.op == "cos" for e in ir.walk(list(k.bodies.values()))))


def test_small_table_computed_once():
    assert _kernels_computing_cos(_inputs()) == 1


def test_large_value_stays_inlined(monkeypatch):
    # the check above can fail: past the size limit each reader recomputes it
    monkeypatch.setattr(lowering.GraphLowering, "REALIZE_LIBDEVICE_NUMEL", 16 * 8 - 1)
    assert _kernels_computing_cos(_inputs()) == 2


def test_outputs_match_eager(native_cache):
    run_case(rope_like, _inputs(), cache_dir=native_cache)

