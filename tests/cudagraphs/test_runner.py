"""The CUDA-graph runner on CPU tensors with a fake graph API (fake_cuda.py): warm-up, recording,
replay, static and copied inputs, held outputs, limits and fallbacks. With the production settings:
what would need a second recording of the same shapes (a static input that moved, an output held
for good) disables the runner, with the reason, and every result stays right."""
import gc

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

import ember.cudagraphs as cg
from ember.cudagraphs import analysis
from ember.cudagraphs.pool import TorchCuda
from ember.cudagraphs.recording import ALIAS, COPY, REVERT_AFTER


class Counted:
    """A 'compiled function' that counts how often its Python runs."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def mlp(x, w, b):
    return ((x @ w + b).relu() * 2,)


def make(fake, fn=mlp, example=(), **kw):
    counted = Counted(fn)
    return counted, cg.cudagraphify(counted, None, list(example), api=fake, **kw)


def test_warm_up_then_record_then_replay_without_python(fake):
    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))
    fn, run = make(fake, example=[torch.randn(3, 8), w, b])
    assert isinstance(run, cg.Runner)
    with torch.no_grad():
        for k in range(5):
            x = torch.randn(3, 8)
            (out,) = run(x, w, b)
            torch.testing.assert_close(out, mlp(x, w, b)[0])
            del out  # an output still held at the next call would make that call run without the graph
            if k == 0:
                assert fn.calls == 1 and fake.captures == 0  # never captured on the first call
    # warm-up, then the recording call (one run on placeholders + the capture): no Python after that
    assert fn.calls == 3 and fake.captures == 1
    assert fake.replays == 4  # the recording call replays once too (a capture runs nothing)
    s = cg.stats()
    assert (s["warmups"], s["recordings"], s["replays"]) == (1, 1, 3)


def test_parameters_and_stable_inputs_are_read_in_place(fake):
    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))
    x = torch.randn(3, 8)
    _, run = make(fake)
    with torch.no_grad():
        run(x, w, b)
        run(x, w, b)  # same x at warm-up and recording: static
        rec = run.current
        assert rec.static_kind == {0: "stable address", 1: "parameter", 2: "parameter"}
        assert rec.placeholders == []
        x.mul_(3)  # in-place changes are seen: the graph reads x's memory
        torch.testing.assert_close(run(x, w, b)[0], mlp(x, w, b)[0])
        with torch.no_grad():
            w.add_(1)
        torch.testing.assert_close(run(x, w, b)[0], mlp(x, w, b)[0])


def test_an_input_that_moves_disables_the_runner(fake):
    w, b = torch.randn(8, 4), torch.randn(4)
    x = torch.randn(3, 8)
    fn, run = make(fake)
    run(x, w, b)
    run(x, w, b)
    assert run.current.static_kind == {0: "stable address", 1: "stable address", 2: "stable address"}
    for _ in range(3):
        x2 = torch.randn(3, 8)
        torch.testing.assert_close(run(x2, w, b)[0], mlp(x2, w, b)[0])
    assert run.recorded == 1 and run.demoted == {0}
    assert run.disabled == "static input(s) [0] moved; recording again is disabled (see runner.REPLACE_RECORDINGS)"
    assert fn.calls == 1 + 2 + 3  # warm-up, recording (a run and the capture), then the function itself


def test_a_new_tensor_at_a_freed_inputs_address_is_not_static(fake):
    """An allocator reuses freed memory: the recording call's fresh input may land where the
    warm-up's input was. Taking that for a static input made the runner depend on the allocator
    (it re-recorded, or in production disabled itself, when the next input landed elsewhere)."""
    mem = torch.randn(3, 8)

    def at_mem():  # a new storage over the same memory, as a reused allocation is
        st = torch._C._construct_storage_from_data_pointer(mem.data_ptr(), mem.device,
                                                           mem.untyped_storage().nbytes())
        return torch.empty(0).set_(st, 0, (3, 8), (8, 1))

    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))
    _, run = make(fake)
    with torch.no_grad():
        run(at_mem(), w, b)
        run(at_mem(), w, b)
        assert run.current.static_kind == {1: "parameter", 2: "parameter"}
        for _ in range(3):
            x = torch.randn(3, 8)
            torch.testing.assert_close(run(x, w, b)[0], mlp(x, w, b)[0])
    assert run.disabled is None and run.recorded == 1 and cg.stats()["replays"] == 3


def test_a_replaced_parameter_disables_the_runner(fake):
    lin = torch.nn.Linear(8, 4)
    f = lambda x, w, b: (torch.nn.functional.linear(x, w, b),)  # noqa: E731
    _, run = make(fake, f)
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(3):
            run(x, lin.weight, lin.bias)
        lin.weight.data = torch.randn(4, 8)  # new storage
        torch.testing.assert_close(run(x, lin.weight, lin.bias)[0], lin(x))
    assert run.recorded == 1 and run.disabled.startswith("static input(s) [1] moved")


def test_an_output_held_across_calls_is_never_overwritten(fake):
    w, b = torch.randn(8, 4), torch.randn(4)
    _, run = make(fake)
    xs = [torch.randn(3, 8) for _ in range(12)]
    run(xs[0], w, b)
    (y1,) = run(xs[1], w, b)          # recorded: y1 aliases the graph's output
    (y2,) = run(xs[2], w, b)          # y1 still held: this call runs without the graph
    torch.testing.assert_close(y1, mlp(xs[1], w, b)[0])
    torch.testing.assert_close(y2, mlp(xs[2], w, b)[0])
    rec = run.current
    assert rec.mode == [COPY] and cg.stats()["fallbacks"] == 1
    del y1
    kept = []
    for x in xs[3:6]:                  # held again each time: copies, never the graph's own memory
        kept.append((run(x, w, b)[0], x))
    for y, x in kept:
        torch.testing.assert_close(y, mlp(x, w, b)[0])
        assert y.untyped_storage().data_ptr() != rec.storage_ptr(0)
    del kept, y2
    for x in xs[6:6 + REVERT_AFTER + 1]:  # copies nobody keeps: back to aliasing the graph's memory
        run(x, w, b)
    assert rec.mode == [ALIAS] and run.recorded == 1


def test_an_output_held_for_good_disables_the_runner(fake):
    w, b = torch.randn(8, 4), torch.randn(4)
    _, run = make(fake)
    run(torch.randn(3, 8), w, b)
    x1 = torch.randn(3, 8)
    (first,) = run(x1, w, b)
    for _ in range(3):
        run(torch.randn(3, 8), w, b)
    # one hazard fallback, then (still held) disabled rather than recorded anew; `first` is intact
    assert run.recorded == 1 and cg.stats()["fallbacks"] == 1
    assert run.disabled.startswith("1 graph output(s) still held across calls")
    torch.testing.assert_close(first, mlp(x1, w, b)[0])
    x = torch.randn(3, 8)
    torch.testing.assert_close(run(x, w, b)[0], mlp(x, w, b)[0])


def test_new_shapes_are_recorded_up_to_the_limit(fake, caplog):
    _, run = make(fake, lambda x: (x.sin() + 1,), max_recordings=2)
    for n in (2, 3, 4, 5):
        for _ in range(3):
            x = torch.randn(n)
            torch.testing.assert_close(run(x)[0], x.sin() + 1)
    assert run.disabled and "limit 2" in run.disabled
    assert "runs without CUDA graphs from now on" in caplog.text


def test_outputs_that_alias_inputs_are_rebuilt_on_the_callers_inputs(fake):
    def f(x, w):
        return x, x.view(-1)[2:], w.t(), x * w.sum()
    _, run = make(fake, f)
    w = torch.nn.Parameter(torch.randn(2, 3))
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 3)
            out = run(x, w)
            assert out[0] is x and out[1]._base is x or out[1].data_ptr() == x.data_ptr() + 8
            assert out[2].data_ptr() == w.data_ptr() and out[2].shape == (3, 2)
            torch.testing.assert_close(out[3], x * w.sum())


def test_outputs_sharing_a_storage_share_their_copy(fake):
    def f(x):
        y = x * 2
        return y, y[1:], y.t()
    _, run = make(fake, f)
    x = torch.randn(3, 3)
    run(x)
    held = run(x)
    out = run(torch.ones(3, 3))  # held: falls back, storage switches to COPY
    out = run(torch.ones(3, 3) * 5)  # still held: the runner disables itself
    out = run(torch.ones(3, 3) * 7)
    del held
    out = run(torch.ones(3, 3) * 7)
    assert out[1].untyped_storage().data_ptr() == out[0].untyped_storage().data_ptr() == out[2].untyped_storage().data_ptr()
    torch.testing.assert_close(out[2], torch.full((3, 3), 14.0))


def test_boxed_callables_stay_boxed(fake):
    def f(args):
        x, = args
        args.clear()
        return [x.cos()]
    f._boxed_call = True
    run = cg.cudagraphify(f, None, [torch.randn(4)], api=fake)
    assert run._boxed_call
    for _ in range(3):
        x = torch.randn(4)
        box = [x]
        torch.testing.assert_close(run(box)[0], x.cos())
        assert box == []


def test_inside_someone_elses_capture_the_function_runs_as_is(fake):
    """A user's ``torch.cuda.graph`` around the compiled function: no warm-up, recording or replay of
    our own there (recording inside a capture fails and would invalidate theirs), the runner stays
    enabled, and it records and replays as usual once the capture is over."""
    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))
    fn, run = make(fake, example=[torch.randn(3, 8), w, b])
    with torch.no_grad():
        fake.capturing_now = True
        for _ in range(4):
            x = torch.randn(3, 8)
            (out,) = run(x, w, b)
            torch.testing.assert_close(out, mlp(x, w, b)[0])
            del out
        assert fn.calls == 4 and fake.captures == 0 and run.disabled is None
        fake.capturing_now = False
        for _ in range(4):
            x = torch.randn(3, 8)
            (out,) = run(x, w, b)
            torch.testing.assert_close(out, mlp(x, w, b)[0])
            del out
    assert fake.captures == 1 and fake.replays >= 2 and run.disabled is None


def test_capture_failure_disables_with_a_reason(fake):
    _, run = make(fake, lambda x: (x * x.sum().item(),))
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(run(x)[0], x * x.sum().item())
    assert run.disabled.startswith("capture failed")


def test_inputs_written_in_place_must_stay_put(fake):
    def f(x, y):
        x.add_(1)
        return (x * y,)
    gm = make_fx(f)(torch.zeros(3), torch.ones(3))
    assert analysis.mutated_inputs(gm) == {0}
    x, y = torch.zeros(3), torch.ones(3)
    run = cg.cudagraphify(gm, gm, [x, y], api=fake)
    for k in range(4):  # same x: static, and the graph's write lands in it
        run(x, y)
        assert x.tolist() == [k + 1.0] * 3
    assert run.disabled is None and run.recorded == 1
    run2 = cg.cudagraphify(gm, gm, [x, y], api=fake)
    xs = [torch.zeros(3) for _ in range(3)]
    for xi in xs:  # a new tensor each call: cannot be static, so no graph
        run2(xi, y)
    assert all(xi.tolist() == [1.0] * 3 for xi in xs)
    assert "in place" in run2.disabled


def test_skip_reasons():
    real = TorchCuda()
    f = lambda x: x + 1  # noqa: E731
    assert cg.cudagraphify(f, None, [torch.randn(2)], api=real) is f
    gm = make_fx(lambda x: torch.nonzero(x))(torch.randn(4))
    assert "host" in analysis.skip_reason(gm, [torch.randn(4)], _AllDevices())
    gm = make_fx(lambda x: (x + 1).cpu() * 2)(torch.randn(4))
    assert analysis.skip_reason(gm, [torch.randn(4)], real) == "input 0 is a cpu tensor"
    gm = make_fx(lambda x: x.sin(), tracing_mode="symbolic")(torch.randn(4))
    assert "dynamic shapes" in analysis.skip_reason(gm, [torch.randn(4)], _AllDevices())
    assert cg.stats()["skipped"]


@pytest.mark.parametrize("op", ["_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                                "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention_backward",
                                "scaled_dot_product_attention"])
def test_attention_with_dropout_is_never_captured(op):
    """Attention dropout's philox seed is a host tensor outside a capture and a device tensor inside
    one: a replayed forward feeding a normally run backward crashed the process (GPT-2 training,
    automatic CUDA graphs). Forward and backward kernels, every SDPA variant; dropout 0 still captures."""
    target = getattr(torch.ops.aten, op).default
    args = target._schema.arguments
    for p, expect in ((0.1, "dropout"), (0.0, None)):
        g = fx.Graph()
        kwargs = {a.name: p if a.name == "dropout_p" else g.placeholder(a.name)
                  for a in args if a.name == "dropout_p" or not a.has_default_value()}
        g.output(g.call_function(target, (), kwargs))
        gm = fx.GraphModule(torch.nn.Module(), g)
        reason = analysis.skip_reason(gm, [], _AllDevices())
        if expect is None:
            assert reason is None or "dropout" not in reason
        else:
            assert reason is not None and "dropout" in reason, reason


def test_attention_dropout_from_a_real_trace_is_not_captured():
    q = torch.randn(1, 2, 4, 8)
    gm = make_fx(lambda q: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, dropout_p=0.2),
                 tracing_mode="fake")(q)
    assert "dropout" in analysis.skip_reason(gm, [q], _AllDevices())
    gm = make_fx(lambda q: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q))(q)
    assert analysis.skip_reason(gm, [q], _AllDevices()) is None


class _AllDevices(TorchCuda):
    def is_graph_tensor(self, t):
        return True


def test_a_later_graphs_held_output_blocks_an_earlier_graphs_replay(fake):
    """The pool rule: a graph captured earlier may have scratch where a later one keeps outputs."""
    fa, a = make(fake, lambda x: (x + 1,))
    fb, b = make(fake, lambda x: (x * 3,))
    x = torch.randn(4)
    for run in (a, b):
        run(x)
        run(x)
    assert a.current.seq < b.current.seq
    (held,) = b(x)
    torch.testing.assert_close(a(x)[0], x + 1)
    assert cg.stats()["fallbacks"] == 1 and b.current.mode == [COPY]
    torch.testing.assert_close(a(x)[0], x + 1)
    assert a.recorded == 1 and a.disabled.startswith("1 graph output(s) still held")
    torch.testing.assert_close(held, x * 3)  # a never replayed over b's output
    del held
    n = cg.stats()["replays"]
    a(x)
    b(x)
    assert cg.stats()["replays"] == n + 1  # b replays; a runs its function from now on


def test_a_freed_runner_hands_its_held_outputs_over(fake):
    _, a = make(fake, lambda x: (x + 1,))
    _, b = make(fake, lambda x: (x * 3,))
    x = torch.randn(4)
    a(x), a(x)
    b(x), b(x)
    (held,) = b(x)
    entry = b.current.entries[0]
    del b
    gc.collect()
    assert entry.owner is None and entry.baseline == 0 and entry.held()
    a(x)
    assert cg.stats()["fallbacks"] == 1
    del held
    gc.collect()
    a(x)
    assert cg.stats()["replays"] == 2


def test_non_tensor_inputs_are_part_of_the_signature(fake):
    _, run = make(fake, lambda x, k: (x * k,))
    x = torch.randn(3)
    for k in (2, 2, 2, 3, 3, 3):
        torch.testing.assert_close(run(x, k)[0], x * k)
    assert run.recorded == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_non_dense_inputs_keep_their_layout(fake, dtype):
    _, run = make(fake, lambda x: (x * 2,))
    base = torch.arange(4, dtype=dtype)
    for k in range(3):
        x = (base + k).expand(3, 4)  # stride 0: copied as its raw span
        torch.testing.assert_close(run(x)[0], x * 2)


def test_another_view_at_a_stable_address_is_not_replayed_blindly(fake):
    _, run = make(fake, lambda x: (x.sum(0),))
    base = torch.randn(8, 4)
    run(base)
    run(base)  # static: read in place
    assert run.current.static_kind == {0: "stable address"}
    head = base[:4]  # same address, other shape
    torch.testing.assert_close(run(head)[0], head.sum(0))
    torch.testing.assert_close(run(base)[0], base.sum(0))
