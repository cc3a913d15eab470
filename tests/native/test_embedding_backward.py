"""The embedding's backward stays ATen's embedding_dense_backward (ember/native/decomp.py): the
weight's gradient is eager's, bit for bit, for every padding/scale configuration."""
import copy

import pytest
import torch

import ember


@pytest.mark.parametrize("kw", [{}, {"padding_idx": 0}, {"scale_grad_by_freq": True},
                                {"padding_idx": 3, "scale_grad_by_freq": True}])
def test_embedding_weight_grad_is_eagers(kw):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(50, 8, **kw), torch.nn.Linear(8, 4))
    ref = copy.deepcopy(m)
    idx = torch.randint(0, 50, (4, 7))
    idx[0, :3], idx[1, :2] = 0, 3  # repeated ids, and the padding ids
    ember.compile(m)(idx).square().sum().backward()
    ref(idx).square().sum().backward()
    assert torch.equal(m[0].weight.grad, ref[0].weight.grad)


def test_backward_graph_keeps_embedding_dense_backward():
    from ember.native.decomp import AOT_DECOMPOSITIONS, DECOMPOSITIONS
    op = torch.ops.aten.embedding_dense_backward.default
    assert op not in DECOMPOSITIONS and AOT_DECOMPOSITIONS.get(op, "absent") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_weight_grad_cuda(dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(1000, 64, padding_idx=1), torch.nn.Linear(64, 16)).cuda().to(dtype)
    ref = copy.deepcopy(m)
    idx = torch.randint(0, 1000, (8, 128), device="cuda")
    ember.compile(m)(idx).float().square().sum().backward()
    ref(idx).float().square().sum().backward()
    torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=1e-2 if dtype == torch.bfloat16 else 1e-5)
