"""Norm layers that update running statistics in training: after several steps every buffer equals
eager's (on CUDA, batch norm's decomposition writes them with copy_ below functionalization; the
partitioner once dropped those writes, and the statistics never moved)."""
import copy

import pytest
import torch

import ember

NORMS = {
    "batchnorm1d": (lambda: torch.nn.BatchNorm1d(6), (4, 6, 10)),
    "batchnorm2d": (lambda: torch.nn.BatchNorm2d(6), (4, 6, 5, 5)),
    "batchnorm3d": (lambda: torch.nn.BatchNorm3d(6), (2, 6, 3, 4, 4)),
    "instancenorm2d": (lambda: torch.nn.InstanceNorm2d(6, affine=True, track_running_stats=True), (4, 6, 5, 5)),
}


def _check(kind, device, mode=None):
    make, shape = NORMS[kind]
    torch.manual_seed(0)
    model = torch.nn.Sequential(make(), torch.nn.ReLU()).to(device)
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    compiled = ember.compile(model, mode=mode)
    for _ in range(4):
        x = torch.randn(*shape, device=device)
        for m, o in ((compiled, opt), (ref, ref_opt)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for (name, b), c in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{kind} {n}: {m}")
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    model.eval()
    ref.eval()
    x = torch.randn(*shape, device=device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(NORMS))
def test_running_statistics_match_eager_on_cpu(kind):
    _check(kind, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("kind", sorted(NORMS))
def test_running_statistics_match_eager_on_gpu(kind, mode):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check(kind, "cuda", mode)
