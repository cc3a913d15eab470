"""The native backend on graphs with symbolic sizes: kernels that take their sizes as arguments,
generated once and right for every size (eager is the oracle at each size).

Kernels run in the Triton interpreter on CPU tensors (conftest.py), or on the GPU when there is one.
Graphs come either straight from ``make_fx(tracing_mode="symbolic")`` (every dimension >= 2 is a
symbol) or through ``ember.compile`` (the frontend decides what is dynamic). ``COUNTERS`` in
ember/native/backend.py counts the graphs and kernels generated and the static copies compiled by
the per-size fallback, so each test can check that a new size generated nothing.
"""
import glob
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton")

import ember  # noqa: E402
from ember.native import cache, compile_aten_graph  # noqa: E402
from ember.native.backend import COUNTERS, DEFAULT_OPTIONS, plan  # noqa: E402
from tests.native.harness import DEVICE, compare, guarded, padded, trace  # noqa: E402

SMALL_BLOCKS = {"max_xblock": 8, "max_rblock": 8}  # several programs and loop iterations at small sizes


def compile_symbolic(fn, inputs, options=None, cache_dir=None):
    gm = trace(fn, inputs, "symbolic")
    opts = dict(options or {}, cache=cache_dir is not None, **({"cache_dir": cache_dir} if cache_dir else {}))
    return compile_aten_graph(gm, inputs, force_triton=True, options=opts)


def run_sizes(fn, make, sizes, options=None, atol=None, rtol=None):
    """Trace fn symbolically at sizes[0], compile once, run at every size with NaN-guarded inputs
    and sentinel-guarded buffers, compare with eager; no new graph, kernel or per-size copy after
    the first compile. Returns the compiled callable."""
    inputs = make(*sizes[0])
    before = dict(COUNTERS)
    compiled = compile_symbolic(fn, inputs, options)
    assert compiled.ember_native["reason"] is None, compiled.ember_native["reason"]
    generated = dict(COUNTERS)
    for size in sizes:
        xs = [padded(x) for x in make(*size)]
        ref = fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in xs])
        with guarded(compiled) as alloc:
            out = compiled(*xs)
        alloc.check()
        compare(out, ref, atol, rtol)
    assert generated["graphs"] == before["graphs"] + 1
    assert COUNTERS == generated, "a new size generated code"
    return compiled


def R(*shape):
    return torch.randn(*shape, device=DEVICE)


# ------------------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("options", [{}, SMALL_BLOCKS], ids=["default", "small_blocks"])
def test_pointwise_with_broadcast(options):
    run_sizes(lambda x, b: torch.relu(x * 2 + b).sigmoid() - x, lambda n, m: [R(n, m), R(m)],
              [(3, 5), (4, 7), (9, 2), (17, 33)], options)


ROWS = {
    "softmax": lambda x, w, b: torch.softmax(x, -1),
    "log_softmax": lambda x, w, b: torch.log_softmax(x * 2, -1),
    "layer_norm": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
    "rms_norm": lambda x, w, b: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
}


@pytest.mark.parametrize("options", [{}, SMALL_BLOCKS], ids=["default", "small_blocks"])
@pytest.mark.parametrize("name", list(ROWS))
def test_row_reductions(name, options):
    # symbolic row length: a looped reduction (no bound on it is known), one kernel per graph
    compiled = run_sizes(ROWS[name], lambda n, m: [R(n, m), R(m), R(m)], [(3, 5), (4, 70), (9, 2), (2, 33)],
                         options, atol=1e-5, rtol=1e-4)
    assert compiled.ember_native["report"]["kernels"] == 1


def test_column_full_and_index_reductions():
    run_sizes(lambda x: (x.sum(0), x.mean(), x.var(1), x.argmax(-1), (x > 0).any(0), x.amax(0)),
              lambda n, m: [R(n, m)], [(3, 5), (4, 70), (9, 2)], SMALL_BLOCKS, atol=1e-5, rtol=1e-4)


def test_matmul_with_epilogue():
    compiled = run_sizes(lambda x, w, b: torch.relu(x @ w + b) * 2, lambda n, k, m: [R(n, k), R(k, m), R(m)],
                         [(3, 5, 4), (6, 3, 2), (2, 9, 7)], atol=1e-5, rtol=1e-4)
    assert compiled.ember_native["report"]["externs"] == 1


def test_views_reshape_transpose_cat_slice():
    def f(x, y):
        a = torch.cat([x, x[:, 1:] * 2], 1).transpose(0, 1).reshape(-1) + 1
        b = x.reshape(x.shape[0] * x.shape[1]).view(x.shape).t().contiguous() * 3
        c = F.pad(x, (1, 2))[:, 1:-2] - x.unsqueeze(1).expand(-1, y.shape[0], -1).sum(1)
        d = torch.cat([x, y], 0)[-2:] + torch.arange(x.shape[1], device=x.device)
        return a, b, c, d
    run_sizes(f, lambda n, m, k: [R(n, m), R(k, m)], [(3, 5, 2), (4, 7, 6), (9, 2, 3)], SMALL_BLOCKS)


def test_embedding_and_3d_reshapes():
    def f(w, i, x):
        e = F.embedding(i, w) * 2
        b, s, h = x.shape
        y = (x.reshape(b * s, h) * 3).view(b, s, h).transpose(1, 2).contiguous()
        return e, y
    # (first sizes all distinct: a size equal to another at the trace becomes the same symbol, and
    # a later call where they differ would run the ATen graph: ``layout_fallbacks``)
    run_sizes(f, lambda n, m, s: [R(n, 4), torch.randint(0, n, (m,), device=DEVICE), R(2, s, 3)],
              [(5, 6, 7), (6, 7, 2), (4, 2, 9)])


# ------------------------------------------------------------------------------- generated code


def test_sizes_are_arguments_not_constants(native_cache):
    # the sizes of the first call (37, 53) appear in no kernel and not in the wrapper's code
    compiled = compile_symbolic(lambda x, w: F.layer_norm(x, x.shape[-1:], w) + torch.softmax(x, 0), [R(37, 53), R(53)],
                                cache_dir=native_cache)
    wrapper = open(compiled.ember_native["wrapper"]).read()
    code = wrapper[wrapper.index("def make_call"):]
    assert "s0 = arg0.size(0)" in code and "s1 = arg0.size(1)" in code and "DynamicLaunch(" in wrapper
    assert "37" not in code and "53" not in code
    for path in compiled.ember_native["kernels"]:
        src = open(path).read()
        assert "do_not_specialize=" in src and "37" not in src and "53" not in src
    assert "s0 = arg0.size(0)  # hint 37" in compiled.ember_native["sizes"]


def test_ir_prints_and_verifies_symbols():
    x = R(6, 10)
    gm = trace(lambda x: (x.view(-1, 2) * 2).sum(1), [x], "symbolic")
    g, _, _, emitted = plan(gm, [x], dict(DEFAULT_OPTIONS))  # plan runs ir.verify
    text = g.format()
    assert "# s0 = arg0.size(0)" in text and "hint 6" in text
    assert "f32[s0, s1]" in text
    assert all(ek.symbolic for _, ek in emitted)


def test_cache_key_is_the_symbolic_structure(native_cache):
    def f(x):
        return torch.softmax(x, -1) * 2
    first = compile_symbolic(f, [R(3, 5)], cache_dir=native_cache)
    second = compile_symbolic(f, [R(6, 11)], cache_dir=native_cache)  # other hints, other ShapeEnv
    assert not first.ember_native["cache_hit"] and second.ember_native["cache_hit"]
    x = R(4, 9)
    compare(second(x), f(x))


def test_int32_index_math_guards_its_sizes():
    compiled = compile_symbolic(lambda x: x * 2, [R(5)])
    mod = cache.load_module(compiled.ember_native["wrapper"])
    call = mod.make_call([], lambda *args: "ran as is")

    class Huge:  # what the wrapper reads of an input with 2**31 elements
        def size(self, d):
            return 2 ** 31

        def stride(self):
            return (1,)
    assert call(Huge()) == "ran as is"


def test_persistent_reduction_only_with_a_bound(native_cache, monkeypatch):
    from ember.config import config

    monkeypatch.setattr(config, "native_force_triton", True)

    def kinds():  # from each kernel module's first line: "# ember native kernel NAME (KIND): ..."
        paths = glob.glob(f"{native_cache}/native/kernels/*/*.py")
        return {open(p).readline().split("(")[1].split(")")[0] for p in paths}

    f = ember.compile(lambda x: torch.softmax(x, -1))
    x = R(4, 6)
    ember.mark_dynamic(x, 1, max=64)  # rows of at most 64 elements: kept whole in one tile
    compare(f(x), torch.softmax(x, -1))
    assert kinds() == {"per"}
    g = ember.compile(lambda x: torch.softmax(x, -1) + 1)
    y = R(4, 6)
    ember.mark_dynamic(y, 1)  # unbounded rows: looped
    compare(g(y), torch.softmax(y, -1) + 1)
    assert "red" in kinds()
    for n in (3, 40, 64):
        x = R(4, n)
        compare(f(x), torch.softmax(x, -1))
        compare(g(x), torch.softmax(x, -1) + 1)
    assert f._ember_cache.compile_count == 1 and g._ember_cache.compile_count == 1


def test_unsupported_graph_falls_back_to_per_size_kernels():
    def f(x):
        return x.chunk(3, 0)[2] * 2  # where the third chunk starts is not provably inside the tensor
    compiled = compile_symbolic(f, [R(7, 3)])
    assert "compiled per input sizes" in compiled.ember_native["reason"]
    before = COUNTERS["per_shape"]
    for n in (7, 8, 9):
        x = R(n, 3)
        compare(compiled(x), f(x))
    assert COUNTERS["per_shape"] == before + 3


# ------------------------------------------------------------------ through ember.compile


@pytest.fixture
def forced(monkeypatch, native_cache):
    from ember.config import config

    monkeypatch.setattr(config, "native_force_triton", True)


def _generated_once(compiled, calls, warmup=2):
    """Run calls; after the first ``warmup`` (static compile, then the symbolic one), nothing is
    generated any more and no per-size copy is ever compiled."""
    before = COUNTERS["per_shape"]
    for i, call in enumerate(calls):
        if i == warmup:
            snapshot = dict(COUNTERS)
        call()
    assert COUNTERS == snapshot, "a new size generated code"
    assert COUNTERS["per_shape"] == before
    assert compiled._ember_cache.compile_count == 2, compiled._ember_cache.recompile_reasons


def test_transformer_layer_over_sequence_lengths(forced):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).to(DEVICE).train()  # train: no fused fast path
    compiled = ember.compile(layer)

    def call(s):
        def run():
            x = R(2, s, 16)
            with torch.no_grad():
                compare(compiled(x), layer(x), 1e-4, 1e-4)
        return run
    _generated_once(compiled, [call(s) for s in (3, 4, 6, 9)])


class Block(nn.Module):
    def __init__(self, d, h, T):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2's structure at toy size: token and position embeddings, causal attention through a
    sliced mask buffer, pre-norm blocks, a language-model head."""

    def __init__(self, V=50, d=16, h=2, L=2, T=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList([Block(d, h, T) for _ in range(L)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def test_gpt2_like_model_over_sequence_lengths(forced):
    torch.manual_seed(0)
    model = GPT().to(DEVICE).eval()
    compiled = ember.compile(model)

    def call(s):
        def run():
            idx = torch.randint(0, 50, (2, s), device=DEVICE)
            with torch.no_grad():
                compare(compiled(idx), model(idx), 1e-4, 1e-4)
        return run
    _generated_once(compiled, [call(s) for s in (3, 4, 6, 10)])


def test_training_with_changing_batch_size(forced):
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)).to(DEVICE)
    ref, twin = make(), make()
    compiled = ember.compile(twin)

    def step(b):
        def run():
            x, y = R(b, 8), torch.randint(0, 4, (b,), device=DEVICE)
            F.cross_entropy(ref(x), y).backward()
            F.cross_entropy(compiled(x), y).backward()
        return run
    _generated_once(compiled, [step(b) for b in (3, 5, 6, 9)])
    for p, q in zip(ref.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)


def test_symbolic_int_arguments(forced):
    def f(x, n):
        return x.new_zeros(n, 2) + x.sum() * n, torch.arange(n, device=x.device) * x.shape[0]
    compiled = ember.compile(f, dynamic=True)
    before = dict(COUNTERS)
    for n in (2, 3, 5):
        x = R(n + 1)
        compare(compiled(x, n), f(x, n))
    assert COUNTERS["graphs"] == before["graphs"] + 1 and COUNTERS["per_shape"] == before["per_shape"]
    assert compiled._ember_cache.compile_count == 1


# -------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_kernels_serve_every_size():
    # large rows too (looped reductions past one block), and one binary per kernel across sizes
    compiled = run_sizes(lambda x, w, b: (F.layer_norm(x, x.shape[-1:], w, b), torch.softmax(x, -1)),
                         lambda n, m: [R(n, m), R(m), R(m)], [(7, 33), (1000, 5000), (3, 65536), (4096, 768)],
                         atol=1e-5, rtol=1e-4)
    mod = cache.load_module(compiled.ember_native["wrapper"])
    launches = [v for v in vars(mod).values() if type(v).__name__ == "DynamicLaunch"]
    assert launches
    for launch in launches:  # Triton's cache of binaries per device: one entry per specialization
        assert all(len(c[0]) == 1 for c in launch.fn.device_caches.values()), "a kernel was compiled again"


@pytest.mark.slow
def test_gpt2_like_training_kernels_compile_for_sm90():
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_compile_gpt.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["graphs"] == 2 and res["kernels"] > 20, res


def test_negative_symbolic_int_arguments(forced):
    # an int argument is no size: nothing may assume it is >= 0
    def f(x, n):
        return x * n + torch.full_like(x, 1) * (n * 2 - 1)
    compiled = ember.compile(f, dynamic=True)
    before = COUNTERS["per_shape"]
    for n in (-3, 4, -7):
        x = R(5)
        compare(compiled(x, n), f(x, n))
    assert compiled._ember_cache.compile_count == 1 and COUNTERS["per_shape"] == before
