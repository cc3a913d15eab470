"""GPT-2's MLP on CUDA through ember: its tanh GELU runs in cuBLASLt's matmul epilogue
(``ember/native/cuda_mm.py``). GPU only; on the H100:
``python -m pytest -q -s tests/native/test_cuda_mm_gelu.py -m gpu``."""
import pytest
import torch

import ember
from ember.native import cuda_mm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
# the epilogue applies GELU to the fp32 accumulator + bias and rounds once; eager rounds the pre-activation
# to bf16 first and HF's formula after each of its ops: one bf16 rounding apart (tests/native/harness.TOL)
BF16_TOL = dict(rtol=1.6e-2, atol=1.6e-2)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    monkeypatch.delenv("DISABLE_ADDMM_CUDA_LT", raising=False)
    ember.reset()


def test_gpt2_mlp_bf16_gelu_in_cublaslt_epilogue(monkeypatch, tmp_path):
    """transformers' GPT2MLP (bf16, eval, no_grad, GPT-2 124M's sizes at b8x512) compiled by ember: close
    to eager (and no farther from the fp32 result than eager), the pass fired once, the generated wrapper
    calls _addmm_activation, and torch.profiler shows no kernel computing the tanh."""
    transformers = pytest.importorskip("transformers")
    from torch.profiler import ProfilerActivity, profile
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    torch.manual_seed(0)
    cfg = transformers.GPT2Config()
    m = GPT2MLP(4 * cfg.n_embd, cfg).to("cuda", torch.bfloat16).eval()
    x = torch.randn(8, 512, cfg.n_embd, device="cuda", dtype=torch.bfloat16)
    seen = []
    real = cuda_mm.fuse_tanh_gelu
    monkeypatch.setattr(cuda_mm, "fuse_tanh_gelu", lambda gm, *a: seen.append(real(gm, *a)) or seen[-1])
    fn = ember.compile(m)
    with torch.no_grad():
        want = m(x)
        got = fn(x)
        torch.testing.assert_close(got, want, **BF16_TOL)
        truth = GPT2MLP(4 * cfg.n_embd, cfg).to("cuda").eval()
        truth.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
        t = truth(x.float())
        err_ember, err_eager = (got.float() - t).abs().max().item(), (want.float() - t).abs().max().item()
        print(f"max |ember - fp32| {err_ember:.4g}, max |eager bf16 - fp32| {err_eager:.4g}")
        assert err_ember <= 1.5 * err_eager + 1e-3
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(x)
            torch.cuda.synchronize()
    assert sum(seen) == 1, seen
    wrappers = [p.read_text() for p in tmp_path.rglob("*.py")]
    assert any("_addmm_activation" in w and "use_gelu=True" in w for w in wrappers), \
        "no generated wrapper calls _addmm_activation"
    kernels = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print("kernels:", *kernels, sep="\n  ")
    assert kernels and not [k for k in kernels if "tanh" in k], kernels
