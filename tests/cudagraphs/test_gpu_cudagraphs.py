"""CUDA graphs on a real GPU: mode="reduce-overhead" and the cudagraphs backend against eager,
memory-pool hazards between graphs, held outputs, and skipped graphs. GPU only."""
import copy
import time

import pytest
import torch

import ember
import ember.cudagraphs as cg

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh():
    cg.reset()
    yield
    cg.reset()


def _fresh_fn(f):
    import types
    return types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)


def test_tiny_function_replays_and_matches_eager():
    f = ember.compile(_fresh_fn(lambda x: x * 2 + 1), mode="reduce-overhead")
    for _ in range(6):
        x = torch.randn(16, device="cuda")
        torch.testing.assert_close(f(x), x * 2 + 1)
    s = cg.stats()
    assert s["recordings"] == 1 and s["replays"] >= 3 and not s["disabled"], s


def test_held_outputs_keep_their_values():
    f = ember.compile(_fresh_fn(lambda x: torch.softmax(x * 3, -1)), mode="reduce-overhead")
    xs = [torch.randn(64, 128, device="cuda") for _ in range(10)]
    outs = [f(x) for x in xs]  # every output kept
    torch.cuda.synchronize()
    for x, o in zip(xs, outs):
        torch.testing.assert_close(o, torch.softmax(x * 3, -1))
    # a capture that failed here once left the CUDA generator in capture state for the process
    torch.randn(4, device="cuda")


def test_an_earlier_graphs_scratch_never_overwrites_a_later_graphs_held_output():
    """f needs big scratch; g is captured after f, so g's outputs may sit where f's scratch was.
    Holding g's output, f must not replay over it (it runs normally, then is recorded anew)."""
    def big(x):
        y = torch.cat([x] * 64, 0).sin()       # large intermediates, freed at the end
        return (y * y).sum(0) + x.sum(0)
    def small(x):
        return x.cos() * 3
    f = ember.compile(_fresh_fn(big), mode="reduce-overhead")
    g = ember.compile(_fresh_fn(small), mode="reduce-overhead")
    x = torch.randn(256, 1024, device="cuda")
    for _ in range(3):
        f(x)
    for _ in range(3):
        g(x)
    held = g(x)
    expected = x.cos() * 3
    for _ in range(4):
        torch.testing.assert_close(f(x), big(x), rtol=1e-4, atol=1e-3)
    torch.cuda.synchronize()
    torch.testing.assert_close(held, expected)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                               torch.nn.Linear(256, 10))


@pytest.fixture
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("how", [dict(mode="reduce-overhead"), dict(backend="cudagraphs"),
                                 dict(mode="max-autotune")], ids=["reduce-overhead", "cudagraphs", "max-autotune"])
def test_training_steps_match_eager(how, no_tf32):
    torch.manual_seed(0)
    ref = _mlp().cuda()
    twin = copy.deepcopy(ref)
    model = ember.compile(twin, **how)
    # SGD, not Adam: Adam's first steps move each weight by about lr * sign(grad), so rounding noise
    # on a near-zero gradient would show up as an lr-sized difference
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt_c = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(6):
        x = torch.randn(32, 64, device="cuda")
        for m, opt in ((ref, opt_r), (model, opt_c)):
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        torch.testing.assert_close(losses[-1], losses[-2], rtol=1e-4, atol=1e-5)
    for p, q in zip(ref.parameters(), twin.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    s = cg.stats()
    assert s["recordings"] >= 2 and s["replays"] >= 6 and not s["disabled"], s


def test_gradient_accumulation_matches_eager(no_tf32):
    torch.manual_seed(0)
    ref = _mlp().cuda()
    twin = copy.deepcopy(ref)
    model = ember.compile(twin, mode="reduce-overhead")
    for step in range(4):
        xs = [torch.randn(32, 64, device="cuda") for _ in range(3)]
        for m in (ref, model):
            for x in xs:
                m(x).sum().backward()
        for p, q in zip(ref.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4)
        for m in (ref, twin):
            m.zero_grad(set_to_none=True)


def test_gpt2_tiny_inference_and_training():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    ref = GPT2LMHeadModel(cfg).cuda()
    twin = copy.deepcopy(ref)
    model = ember.compile(twin, mode="reduce-overhead")
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=2e-3, atol=2e-3)
    for _ in range(4):
        for m in (ref, model):
            m(ids, labels=ids).loss.backward()
        # judged against the largest gradient, as tests/native/test_gpu_models.py does
        scale = max(float(p.grad.abs().max()) for p in ref.parameters() if p.grad is not None)
        for (n, p), q in zip(ref.named_parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4 * scale, msg=lambda m, n=n: f"{n}: {m}")
            p.grad = q.grad = None
    assert cg.stats()["replays"] > 0


def test_cpu_scalar_inputs_are_never_frozen_into_a_graph():
    f = ember.compile(_fresh_fn(lambda x, s: x * s), mode="reduce-overhead")
    x = torch.randn(8, device="cuda")
    for k in (1, 1, 1, 2, 2, 2, 3):
        s = torch.tensor(float(k))  # a CPU scalar: a graph would keep the value it saw at capture
        torch.testing.assert_close(f(x, s), x * k)
    s = cg.stats()
    # a CPU tensor input rules the graph out (unless the value was specialized into the graph)
    assert any("cpu tensor" in r for r in s["skipped"]) or s["replays"] > 0, s


def _per_call_us(fn, x, n=2000):
    for _ in range(50):
        fn(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def test_a_chain_of_kernels_replays_as_one_graph():
    # per-call times are printed, not asserted (a timed assertion flips with the host's load; the
    # suite's benchmarks measure speed): every steady call must be a replay, with eager's results
    def chain(x):
        for _ in range(8):
            x = torch.softmax(x, -1) * 2  # a reduction per step: several kernels
        return x
    default = ember.compile(_fresh_fn(chain))
    graphs = ember.compile(_fresh_fn(chain), mode="reduce-overhead")
    x = torch.randn(32, 64, device="cuda")
    torch.testing.assert_close(graphs(x), default(x))
    torch.testing.assert_close(graphs(x), chain(x))
    before = cg.stats()
    t_default, t_graphs = _per_call_us(default, x), _per_call_us(graphs, x)
    after = cg.stats()
    print(f"\nper call: default {t_default:.1f} us, reduce-overhead {t_graphs:.1f} us")
    assert after["replays"] - before["replays"] == 50 + 2000
    assert after["recordings"] == before["recordings"] and after["fallbacks"] == before["fallbacks"]


def test_random_ops_draw_new_numbers_at_every_replay():
    f = ember.compile(_fresh_fn(lambda x: torch.nn.functional.dropout(x, 0.5, training=True) + 1),
                      mode="reduce-overhead")
    x = torch.ones(4096, device="cuda")
    masks = [(f(x) != 1).clone() for _ in range(6)]
    assert cg.stats()["replays"] >= 3
    for a, b in zip(masks[2:], masks[3:]):  # replays: each one a fresh mask
        assert not torch.equal(a, b)
    assert all(0.4 < m.float().mean().item() < 0.6 for m in masks)


def test_threads_calling_one_reduce_overhead_function_get_eager_results():
    """4 threads on the default stream, each keeping every output it gets: replays are serialised by
    the runner's lock, and outputs held by one thread are never overwritten by another's replay."""
    import threading
    f = ember.compile(_fresh_fn(lambda x, w: torch.tanh(x @ w) * 2 + x.sum(-1, keepdim=True)), mode="reduce-overhead")
    w = torch.randn(64, 64, device="cuda")
    barrier, failures = threading.Barrier(4), []

    def body(i):
        g = torch.Generator(device="cuda").manual_seed(i)
        xs = [torch.randn(32, 64, device="cuda", generator=g) for _ in range(60)]
        barrier.wait()
        try:
            outs = [f(x, w) for x in xs]  # all held until the end
            torch.cuda.synchronize()
            for k, (x, o) in enumerate(zip(xs, outs)):
                want = torch.tanh(x @ w) * 2 + x.sum(-1, keepdim=True)
                if not torch.allclose(o, want, rtol=1e-4, atol=1e-4):
                    failures.append(f"thread {i} call {k}: max diff {(o - want).abs().max().item():.3g}")
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=body, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
