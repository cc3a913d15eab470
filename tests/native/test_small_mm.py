"""Small matmuls as one Triton launch (ember/native/small_mm.py): which ones qualify, what the
wrapper calls, and results against eager (in the interpreter on CPU, for real on a GPU)."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from ember.native import compile_aten_graph  # noqa: E402
from ember.native.small_mm import SmallMM, config  # noqa: E402
from tests.native.harness import DEVICE, compare, trace  # noqa: E402


def _compiled(fn, inputs, tmp_path, **opts):
    gm = trace(fn, inputs)
    out = compile_aten_graph(gm, inputs, force_triton=True, options={"cache_dir": str(tmp_path), **opts})
    return out, open(out.ember_native["wrapper"]).read()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_linear_layers_launch_the_template(tmp_path, dtype):
    # a transposed weight, a broadcast bias, a matmul whose K is not a multiple of the tile, a GELU
    # between: the wrapper passes the weight itself (strides baked in) and calls no ATen matmul
    def f(x, w1, b1, w2):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2)
    inputs = [torch.randn(8, 40, device=DEVICE, dtype=dtype), torch.randn(24, 40, device=DEVICE, dtype=dtype),
              torch.randn(24, device=DEVICE, dtype=dtype), torch.randn(5, 24, device=DEVICE, dtype=dtype)]
    fn, src = _compiled(f, inputs, tmp_path)
    assert "from ember.native.small_mm import SmallMM" in src and src.count("SmallMM('") == 2
    assert "aten_addmm" not in src and "aten_mm" not in src and "as_strided(arg1" not in src
    ref = f(*inputs)
    # bf16: the interpreter rounds to bf16 by truncation (a GPU rounds to nearest), so allow a couple
    # of units in the last place of the largest output
    tol = {"atol": 2e-2 * float(ref.abs().max()), "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    compare(fn(*inputs), ref, **tol)


def test_alpha_beta_and_views_with_an_offset(tmp_path):
    def f(bias, a, b):
        return torch.addmm(bias, a[2:], b[:, 1:], beta=0.5, alpha=2.0)
    inputs = [torch.randn(1, 7, device=DEVICE), torch.randn(10, 16, device=DEVICE), torch.randn(16, 8, device=DEVICE)]
    fn, src = _compiled(f, inputs, tmp_path)
    assert "SmallMM('addmm', 8, 7, 16" in src and ", 2.0, 0.5," in src
    compare(fn(*inputs), f(*inputs))


def test_large_or_unsupported_matmuls_keep_the_aten_op(tmp_path):
    a, b = torch.randn(32, 64, device=DEVICE), torch.randn(64, 32, device=DEVICE)
    _, src = _compiled(lambda a, b: a @ b, [a, b], tmp_path, small_mm_flops=2 * 32 * 64 * 32 - 1)
    assert "SmallMM" not in src and "aten_mm_default(" in src
    _, src = _compiled(lambda a, b: a @ b, [a, b], tmp_path / "off", small_mm_flops=0)
    assert "SmallMM" not in src
    # batched and integer matmuls are not its business
    x = torch.randn(2, 8, 8, device=DEVICE)
    _, src = _compiled(lambda x: torch.bmm(x, x), [x], tmp_path / "bmm")
    assert "SmallMM" not in src
    i = torch.randint(0, 5, (8, 8), device=DEVICE)
    _, src = _compiled(lambda i: i @ i, [i], tmp_path / "int")
    assert "SmallMM" not in src


@pytest.mark.parametrize("act", ["gelu", "relu"])
@pytest.mark.parametrize("keep_pre", [False, True])
def test_activation_runs_in_the_matmul_epilogue(tmp_path, act, keep_pre):
    # one launch per layer: the activation is the template's epilogue; a graph that also returns the
    # value before the activation (as a training forward keeps it) gets both from the one launch
    fn_act = F.gelu if act == "gelu" else torch.relu

    def f(x, w1, b1, w2, b2):
        h = F.linear(x, w1, b1)
        y = F.linear(fn_act(h), w2, b2)
        return (y, h) if keep_pre else y
    inputs = [torch.randn(8, 40, device=DEVICE), torch.randn(24, 40, device=DEVICE), torch.randn(24, device=DEVICE),
              torch.randn(5, 24, device=DEVICE), torch.randn(5, device=DEVICE)]
    fn, src = _compiled(f, inputs, tmp_path)
    op = "addmm_act2" if keep_pre else "addmm_act"
    assert f"SmallMM('{op}', 8, 24, 40" in src and f"'{act}', {keep_pre})" in src, src
    assert "Launch(triton" not in src and "load_kernel(" not in src, src  # no kernel of its own
    compare(fn(*inputs), f(*inputs))


def test_fused_activation_ops_match_aten():
    # the ops' own implementations: what runs where a fused matmul does not become a SmallMM
    from ember.native import small_mm  # noqa: F401 - defines the ops
    b, x, w = torch.randn(6), torch.randn(3, 4), torch.randn(4, 6)
    for act, ref in (("gelu", F.gelu), ("relu", torch.relu)):
        pre = torch.addmm(b, x, w)
        torch.testing.assert_close(torch.ops.ember_native.addmm_act(b, x, w, act), ref(pre))
        got = torch.ops.ember_native.addmm_act2(b, x, w, act)
        torch.testing.assert_close(got[0], pre)
        torch.testing.assert_close(got[1], ref(pre))


def test_unfused_when_not_exactly_the_activation(tmp_path):
    # GELU's tanh form, and an erf GELU whose inner product is reused elsewhere (CSE merges the two
    # products), are not the pattern
    def f(x, w, b, w2):
        h, h2 = F.linear(x, w, b), F.linear(x, w2, b)
        return F.gelu(h, approximate="tanh"), F.gelu(h2), (h2 * 0.7071067811865476).sum()
    inputs = [torch.randn(8, 16, device=DEVICE), torch.randn(12, 16, device=DEVICE), torch.randn(12, device=DEVICE),
              torch.randn(12, 16, device=DEVICE)]
    fn, src = _compiled(f, inputs, tmp_path)
    assert "addmm_act" not in src and "SmallMM('addmm'" in src
    compare(fn(*inputs), f(*inputs))


@pytest.mark.parametrize("act", [torch.nn.GELU, torch.nn.ReLU])
def test_training_step_matches_eager(act):
    import ember
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), act(), torch.nn.Linear(32, 4)).to(DEVICE)
    twin = torch.nn.Sequential(torch.nn.Linear(16, 32), act(), torch.nn.Linear(32, 4)).to(DEVICE)
    twin.load_state_dict(m.state_dict())
    x = torch.randn(8, 16, device=DEVICE)
    from ember.config import config as ember_config
    old = ember_config.native_force_triton
    ember_config.native_force_triton = True
    try:
        out = ember.compile(m)(x)
        out.square().sum().backward()
    finally:
        ember_config.native_force_triton = old
    ref = twin(x)
    ref.square().sum().backward()
    compare(out, ref)
    for p, q in zip(m.parameters(), twin.parameters()):
        compare(p.grad, q.grad)


def test_config_tiles_fit_the_problem():
    c = config(32, 1024, 512, torch.float32)
    assert c["BLOCK_M"] == 32 and c["BLOCK_K"] == 32
    c = config(3, 5, 7, torch.bfloat16)
    assert c["BLOCK_M"] == 16 and c["BLOCK_N"] == 32 and c["BLOCK_K"] == 16
    assert repr(SmallMM("mm", 3, 5, 7, (7, 1), (5, 1), None, 1, 1, c)) == "SmallMM('mm', 3, 5, 7)"


@pytest.mark.parametrize("cudagraphs", [False, True], ids=["default", "reduce-overhead"])
def test_cuda_graph_modes_keep_the_aten_matmul(tmp_path, cudagraphs):
    """Under CUDA graphs nothing launches from Python, so SmallMM's CPU saving is gone and cuBLAS's
    faster kernel is kept (the options reduce-overhead and max-autotune compile with)."""
    from ember.backends.ember_backend import native_options
    inputs = [torch.randn(8, 40, device=DEVICE), torch.randn(40, 24, device=DEVICE)]
    _, src = _compiled(torch.mm, inputs, tmp_path, **native_options(cudagraphs, False))
    assert ("SmallMM(" in src) is not cudagraphs and ("aten_mm" in src) is cudagraphs
