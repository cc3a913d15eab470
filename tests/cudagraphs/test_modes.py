"""How the modes and the ``cudagraphs`` backend reach the runner (CPU: fake graph API injected)."""
import warnings

import pytest
import torch

import ember
import ember.cudagraphs as cg
from ember.backends import ember_backend as ember_backends


def test_cudagraphs_backend_is_listed():
    assert "cudagraphs" in ember.list_backends()


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_modes_on_cpu_tensors_run_with_default_settings_and_say_so(mode):
    f = ember.compile(lambda t: t.sin() * 2, mode=mode)
    x = torch.randn(5)
    with pytest.warns(UserWarning, match="no effect on CPU tensors"):
        out = f(x)
    torch.testing.assert_close(out, x.sin() * 2)


def test_mode_table():
    assert ember_backends.MODES["reduce-overhead"] == (True, False)
    assert ember_backends.MODES["max-autotune"] == (True, True)
    assert ember_backends.MODES["max-autotune-no-cudagraphs"] == (False, True)


def test_cudagraphs_backend_trains_through_graphs(fake, monkeypatch):
    monkeypatch.setattr(cg, "TorchCuda", lambda: fake)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    twin.load_state_dict(ref.state_dict())
    model = ember.compile(twin, backend="cudagraphs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no mode warning: the backend itself is the choice
        for _ in range(4):
            x = torch.randn(4, 6)
            for m, net in ((ref, ref), (model, twin)):
                m(x).square().mean().backward()
            for p, q in zip(ref.parameters(), twin.parameters()):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
                p.grad = q.grad = None
    s = cg.stats()
    assert s["recordings"] == 2 and s["replays"] >= 4, s
