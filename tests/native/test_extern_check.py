"""The first call of a compiled native graph checks each extern call's result against the metadata the
code was planned with (ember/native/extern_check.py): custom ops whose fake functions lie
(tests/native/lying_ops.py) give eager's result, logged and counted once, on the C++ renderer and on
the Triton path (the interpreter on CPU, the GPU where there is one); with the check off the same
graphs give wrong results (so these tests show the check matters); later calls run no check."""
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from ember.config import config  # noqa: E402
from ember.diagnostics import counters  # noqa: E402
from ember.native import compile_aten_graph, extern_check  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402
from tests.native.lying_ops import OPS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RENDERERS = ["cpp", "triton"]

# graphs consuming a lying op's result with fused pointwise work (one kernel after the extern call)
CASES = {
    "dtype": lambda x: (OPS.dtype(x).sin() + 1,),  # float64 where float32 was said
    "shape": lambda x: (OPS.shape(x).sin() + 1,),  # [8, 6] where [4, 6] was said
    "pair": lambda x: (lambda a, b: (a * b + 1, a.cos()))(*OPS.pair(x)),  # the second result of two lies
}


def _device(renderer):
    return "cpu" if renderer == "cpp" else DEVICE


def _compile(fn, inputs, renderer, cache_dir):
    gm = trace(fn, inputs)
    opts = {"cache_dir": cache_dir, "cpu_codegen": "cpp"}
    compiled = compile_aten_graph(gm, inputs, force_triton=renderer == "triton", options=opts)
    assert compiled.ember_native["reason"] is None, compiled.ember_native["reason"]  # (the native code runs)
    return compiled


def _same(out, ref) -> bool:
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-5)
               for a, b in zip(out, ref))


def _mismatch_logs(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "ember.native" and "planned for" in r.getMessage()]


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("lie", sorted(CASES))
def test_a_lying_extern_gives_eagers_result(lie, renderer, native_cache, caplog):
    fn = CASES[lie]
    x = torch.randn(4, 6, device=_device(renderer))
    compiled = _compile(fn, [x], renderer, native_cache)
    before, stats = counters.snapshot(), dict(extern_check.STATS)
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        outs = [compiled(x) for _ in range(3)]
    ref = fn(x)
    for out in outs:  # the first call (re-run through ATen) and the later ones
        torch.testing.assert_close(out, ref)
    msgs = _mismatch_logs(caplog)
    assert len(msgs) == 1, msgs  # said once, not per call
    op = {"dtype": "emberlie.dtype.default", "shape": "emberlie.shape.default", "pair": "emberlie.pair.default"}[lie]
    planned, actual = {"dtype": ("float32[4, 6]", "float64[4, 6]"), "shape": ("float32[4, 6]", "float32[8, 6]"),
                       "pair": ("float32[4, 6]", "float64[4, 6]")}[lie]
    assert op in msgs[0] and f"returned {actual}" in msgs[0] and f"planned for {planned}" in msgs[0], msgs[0]
    assert "runs its ATen code" in msgs[0]
    delta = counters.snapshot() - before
    assert delta["eager_fallbacks.native_extern_meta"] == 1
    assert extern_check.STATS["mismatches"] - stats["mismatches"] == 1
    assert extern_check.STATS["aten_calls"] - stats["aten_calls"] == 3


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("lie", sorted(CASES))
def test_without_the_check_the_result_is_wrong(lie, renderer, native_cache, monkeypatch):
    """What the check prevents: the same graphs, the check off (config.native_extern_check)."""
    monkeypatch.setattr(config, "native_extern_check", False)
    fn = CASES[lie]
    x = torch.randn(4, 6, device=_device(renderer))
    compiled = _compile(fn, [x], renderer, native_cache)
    out = compiled(x)
    assert not _same(out, fn(x))  # C++: float64 bytes read as float32; both: a result of the said dtype or shape


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_stride_lie_is_repaired_not_a_fallback(renderer, native_cache, caplog):
    """A result laid out otherwise than its fake said is copied into the planned strides on every
    call (``fixed_layout``, as for convolution's channels-last results): strides are then no
    difference the code depends on, so no fallback; the log says it once."""
    fn = lambda x: (OPS.strides(x).sin() + 1,)  # noqa: E731
    x = torch.randn(4, 6, device=_device(renderer))
    compiled = _compile(fn, [x], renderer, native_cache)
    stats = dict(extern_check.STATS)
    with caplog.at_level(logging.INFO, logger="ember.native"):
        outs = [compiled(x) for _ in range(2)]
    for out in outs:
        torch.testing.assert_close(out, fn(x))
    assert extern_check.STATS["mismatches"] == stats["mismatches"]
    assert extern_check.STATS["passed"] - stats["passed"] == 1
    notes = [r.getMessage() for r in caplog.records if "copied into the planned strides" in r.getMessage()]
    assert len(notes) == 1 and "(1, 4)" in notes[0] and "(6, 1)" in notes[0], notes


def _check(sites=(("op", "buf0", 0, "cpu"),)):
    def call():
        pass
    rec = extern_check._Armed(call, call.__code__, call.__code__, lambda: None, sites, "", False)
    return extern_check.Check(rec, ())


def test_which_differences_count():
    cpu, f32 = torch.device("cpu"), torch.float32
    t = torch.randn(4, 6)
    assert not _check().differs(0, t, f32, (4, 6), (6, 1), cpu, False)
    # strides: only where no fixed_layout repairs them, never on a size-1 dim or an empty tensor
    assert _check().differs(0, t.t().contiguous().t(), f32, (4, 6), (6, 1), cpu, False)
    assert not _check().differs(0, t.t().contiguous().t(), f32, (4, 6), (6, 1), cpu, True)
    assert not _check().differs(0, torch.randn(1, 6).as_strided((1, 6), (99, 1)), f32, (1, 6), (6, 1), cpu, False)
    assert not _check().differs(0, torch.randn(0, 6).as_strided((0, 6), (1, 0)), f32, (0, 6), (6, 1), cpu, False)
    # the storage offset is read at run time by every consumer
    assert not _check().differs(0, torch.randn(30)[6:].view(4, 6), f32, (4, 6), (6, 1), cpu, False)
    # dtype, sizes, device always; a None passes (an undefined result: a consumer would fail loudly)
    assert _check().differs(0, t.double(), f32, (4, 6), (6, 1), cpu, True)
    assert _check().differs(0, t.view(6, 4), f32, (4, 6), (6, 1), cpu, True)
    assert _check().differs(0, t, f32, (4, 6), (6, 1), torch.device("meta"), True)
    assert not _check().differs(0, None, f32, (4, 6), (6, 1), cpu, True)
    assert _check().differs(0, 3, f32, (4, 6), (6, 1), cpu, True)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_later_calls_run_no_check(renderer, native_cache, monkeypatch):
    calls = []
    differs = extern_check.Check.differs

    def counted(self, *args):
        calls.append(args[0])
        return differs(self, *args)
    monkeypatch.setattr(extern_check.Check, "differs", counted)
    fn = lambda x: (OPS.honest(x).sin() + 1, OPS.honest(x * 3))  # noqa: E731
    x = torch.randn(4, 6, device=_device(renderer))
    compiled = _compile(fn, [x], renderer, native_cache)
    mod_src = open(compiled.ember_native["wrapper"]).read()
    assert "def call_first(" in mod_src and "check.differs(" in mod_src
    for i in range(5):
        torch.testing.assert_close(compiled(x), fn(x))
        assert len(calls) == 2, (i, calls)  # both results, at the first call only


def test_a_result_passed_whole_to_another_extern_is_not_checked(native_cache, caplog):
    """ATen reads the real tensor, as eager does; the consumer's own result is checked."""
    fn = lambda x: (OPS.to_float(OPS.dtype(x)) + 1,)  # noqa: E731
    x = torch.randn(4, 6)
    compiled = _compile(fn, [x], "cpp", native_cache)
    src = open(compiled.ember_native["wrapper"]).read()
    assert src.count("check.differs(") == 1
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        torch.testing.assert_close(compiled(x), fn(x))
    assert not _mismatch_logs(caplog)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_random_numbers_drawn_before_the_mismatch_are_drawn_again(renderer, native_cache):
    """The generator is restored before the ATen run: the numbers are eager's."""
    fn = lambda x: (OPS.dtype(OPS.noisy(x)).sin() + 1,)  # noqa: E731
    x = torch.randn(4, 6, device=_device(renderer))
    compiled = _compile(fn, [x], renderer, native_cache)
    arm_line = open(compiled.ember_native["wrapper"]).read().split("arm_extern_check(call, call_first")[1]
    assert arm_line.split("\n")[0].endswith(", True, False)")  # (the generator's state is saved at the first call)
    torch.manual_seed(1)
    out, after = compiled(x), torch.rand(3)
    torch.manual_seed(1)
    ref, ref_after = fn(x), torch.rand(3)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(after, ref_after)


# ember.compile end to end: a graph that mutates an input (aot writes it back after the graph returns)
# with a lying op's result; the first call must give the buffer one update, eager's


def _updater(op):
    def update(x, stats):
        y = op(x)
        stats.mul_(0.9).add_(y.sum(0) * 0.1)
        return y.sin() + 1
    return update


@pytest.mark.parametrize("renderer,lie", [("cpp", "dtype"), ("cpp", "shape"), ("triton", "shape"), ("triton", "dtype")])
@pytest.mark.parametrize("check", [True, False], ids=["check", "no_check"])
def test_a_mutated_input_gets_eagers_update(renderer, lie, check, monkeypatch, caplog):
    import ember
    monkeypatch.setattr(config, "native_force_triton", renderer == "triton")
    monkeypatch.setattr(config, "native_extern_check", check)
    update = _updater(getattr(OPS, lie))
    dev = _device(renderer)
    x, stats = torch.randn(4, 6, device=dev), torch.randn(6, device=dev)
    mine, ref = stats.clone(), stats.clone()
    compiled = ember.compile(update, backend="ember")
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        firsts = compiled(x, mine), update(x, ref)
        right = _same([firsts[0], mine], [firsts[1], ref])
        seconds = compiled(x, mine), update(x, ref)
        right_later = _same([seconds[0], mine], [seconds[1], ref])
    if check:
        assert right and right_later
        assert len(_mismatch_logs(caplog)) == 1
    elif renderer == "cpp" or lie == "shape":
        # (the Triton interpreter loads float64 as float64: the values stay close, the result's dtype
        # differs from eager's, the running buffer's does not: only the output shows it)
        assert not (right and right_later)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_warm_process_checks_again(renderer, tmp_path):
    """A cache hit in a new process (the wrapper loaded from disk; on a GPU, warm_launch adopting the
    recorded launches) checks its first call too: another torch build may return other metadata."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITON_CACHE_DIR=str(tmp_path / "triton"))
    if DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    script = os.path.join(ROOT, "tests", "native", "extern_check_probe.py")
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, script, renderer, str(tmp_path / "cache")], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        assert out.returncode == 0 and lines, out.stderr[-3000:]
        runs.append(json.loads(lines[-1][len("RESULT "):]))
    cold, warm = runs
    assert not cold["hit"] and warm["hit"]
    for run in runs:
        assert run["right"] and run["mismatches"] == 1 and run["honest_passed"] == 1, run


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("check", [True, False], ids=["check", "no_check"])
def test_an_input_the_graph_writes_itself_is_written_once(renderer, check, native_cache, monkeypatch, caplog):
    """A graph traced without functionalization writes its mutated inputs itself, at its end
    (``copy_`` after every extern call): after a mismatch nothing was written yet, so the ATen run
    from the inputs gives the buffer eager's one update."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from ember.native import DECOMPOSITIONS
    monkeypatch.setattr(config, "native_extern_check", check)

    def fn(x, stats):
        y = OPS.shape(x)
        stats.mul_(0.9).add_(y.sum(0) * 0.1)
        return (y.sin() + 1,)
    dev = _device(renderer)
    x, stats = torch.randn(4, 6, device=dev), torch.randn(6, device=dev)
    gm = make_fx(fn, decomposition_table=DECOMPOSITIONS, tracing_mode="fake")(x, stats.clone())
    assert any("copy_" in str(n.target) or str(n.target).endswith("_.Tensor") for n in gm.graph.nodes)
    compiled = compile_aten_graph(gm, [x, stats], force_triton=renderer == "triton",
                                  options={"cache_dir": native_cache, "cpu_codegen": "cpp"})
    assert compiled.ember_native["reason"] is None, compiled.ember_native["reason"]
    mine, ref = stats.clone(), stats.clone()
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        right = [_same([compiled(x, mine)[0], mine], [fn(x, ref)[0], ref]) for _ in range(2)]
    if check:
        assert right == [True, True] and len(_mismatch_logs(caplog)) == 1
    else:
        assert right == [False, False]


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_boxed_graph_keeps_its_inputs_for_the_aten_run(renderer, native_cache):
    """A boxed graph (a backward's: release_inputs) drops each input at its last use; its first call
    holds them until the last check, so the ATen run after a mismatch still has them."""
    fn = lambda x, w: (OPS.dtype(x * 3).sin() + x * w,)  # noqa: E731 - (the inputs are read after the extern)
    dev = _device(renderer)
    x, w = torch.randn(4, 6, device=dev), torch.randn(4, 6, device=dev)
    gm = trace(fn, [x, w])
    compiled = compile_aten_graph(gm, [x, w], force_triton=renderer == "triton",
                                  options={"cache_dir": native_cache, "cpu_codegen": "cpp", "release_inputs": True})
    assert "def run_first(args):" in open(compiled.ember_native["wrapper"]).read()
    boxed = getattr(compiled, "boxed", None)  # (a C++ graph's deferred binding offers the positional form)
    for _ in range(2):
        args = [x, w]
        torch.testing.assert_close(boxed(args) if boxed else compiled(*args), fn(x, w))
        assert args == [] or not boxed  # (the list was taken over)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_boxed_graph_checks_only_before_its_first_dropped_input(renderer, native_cache):
    """Holding a boxed graph's inputs through a late check would keep a backward's saved activations
    alive for the whole first call (GPT-2 training's first step: 2.64 -> 3.59 GB on the H100), so an
    extern after the first input's last use is not checked (as before the check existed)."""
    fn = lambda x, w: (OPS.honest(x * 3).sin() + w, w.cos())  # noqa: E731 - (x's last use is before the extern)
    dev = _device(renderer)
    x, w = torch.randn(4, 6, device=dev), torch.randn(4, 6, device=dev)
    compiled = compile_aten_graph(trace(fn, [x, w]), [x, w], force_triton=renderer == "triton",
                                  options={"cache_dir": native_cache, "cpu_codegen": "cpp", "release_inputs": True})
    assert "check.differs" not in open(compiled.ember_native["wrapper"]).read()
    boxed = getattr(compiled, "boxed", None)
    args = [x, w]
    torch.testing.assert_close(boxed(args) if boxed else compiled(*args), fn(x, w))


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("check", [True, False], ids=["check", "no_check"])
def test_symbolic_sizes_are_checked_at_each_new_set(renderer, check, native_cache, monkeypatch, caplog):
    """A graph with symbolic sizes checks the first call of each new set of sizes: a fake function
    right at the traced sizes and wrong at others is caught where it is wrong."""
    monkeypatch.setattr(config, "native_extern_check", check)
    fn = lambda x: (OPS.rows5(x).sin() + 1,)  # noqa: E731
    dev = _device(renderer)
    x = torch.randn(5, 7, device=dev)  # (at 5 rows the fake is right)
    compiled = compile_aten_graph(trace(fn, [x], "symbolic"), [x], force_triton=renderer == "triton",
                                  options={"cache_dir": native_cache, "cpu_codegen": "cpp"})
    assert compiled.ember_native["reason"] is None and "s1" in compiled.ember_native["sizes"]
    stats = dict(extern_check.STATS)
    right = []
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        for shape in [(5, 7), (5, 3), (5, 3), (8, 7), (5, 7)]:
            x = torch.randn(*shape, device=dev)
            right.append(_same(compiled(x), fn(x)))
    if check:
        assert right == [True] * 5 and len(_mismatch_logs(caplog)) == 1
        # checked: (5, 7), (5, 3) once, (8, 7) mismatched; then ATen for (8, 7) and every later call
        assert extern_check.STATS["compared"] - stats["compared"] == 3
        assert extern_check.STATS["aten_calls"] - stats["aten_calls"] == 2
    else:
        assert right == [True, True, True, False, True]


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_result_planned_on_the_meta_device_is_not_checked(renderer, native_cache, caplog):
    """Attention's philox seed and offset are planned on the meta device: their device (and dtype) is
    the op's run-time choice, no code reads them, they travel to the backward op as they are."""
    fn = lambda x: (lambda y, seed: ((y + 1).sin(), seed))(*OPS.with_seed(x))  # noqa: E731
    x = torch.randn(4, 6, device=_device(renderer))
    compiled = _compile(fn, [x], renderer, native_cache)
    src = open(compiled.ember_native["wrapper"]).read()
    assert "check.differs(0, buf0[0]" in src and "differs(1" not in src  # (only the first result is checked)
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        for _ in range(2):
            out = compiled(x)
            torch.testing.assert_close(out[0], fn(x)[0])
            assert out[1].tolist() == [7, 8]
    assert not _mismatch_logs(caplog)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_result_the_op_places_at_run_time_is_not_checked(renderer, native_cache, caplog):
    """Results named philox_seed/philox_offset/rng_state (extern_check.RUNTIME_PLACED_RESULTS) are
    not checked, whatever their fake says: on the H100, GPT-2 training in fp32 (efficient attention,
    whose fake puts the seed on cuda:0 and whose kernel returns a host tensor) fell back to ATen."""
    fn = lambda x: (lambda y, seed: ((y + 1).sin(), seed))(*OPS.named_seed(x))  # noqa: E731
    x = torch.randn(4, 6, device=_device(renderer))
    compiled = _compile(fn, [x], renderer, native_cache)
    src = open(compiled.ember_native["wrapper"]).read()
    assert "differs(1" not in src
    with caplog.at_level(logging.WARNING, logger="ember.native"):
        for _ in range(2):
            out = compiled(x)
            torch.testing.assert_close(out[0], fn(x)[0])
            assert out[1].tolist() == [7, 8]
    assert not _mismatch_logs(caplog)


# no false alarms: real models' extern calls (matmuls, convolutions, attention) return what was planned


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.flatten(1)).softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_cpu_model_passes_its_checks(train, dtype):
    import ember
    torch.manual_seed(0)
    model = _Net().to(dtype).train(train)
    x = torch.randn(4, 3, 6, 6, dtype=dtype)
    stats = dict(extern_check.STATS)
    compiled = ember.compile(model)
    for _ in range(2):
        out = compiled(x)
        if train:
            out.sum().backward()
    assert extern_check.STATS["mismatches"] == stats["mismatches"]
    assert extern_check.STATS["passed"] > stats["passed"]  # (the checks ran: convolution and matmul results)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["infer_fp32", "infer_bf16", "train_fp32"])
@pytest.mark.parametrize("name", ["gpt2", "bert", "resnet18", "vit"])
def test_gpu_models_pass_their_checks(name, mode):
    """On CUDA (cuBLAS, cuDNN, flash attention): every checked extern result is as planned, so no
    graph falls back to ATen. Run by the lead on the H100."""
    import ember
    from tests.native.test_gpu_models import MODELS
    torch.manual_seed(0)
    model, inputs, pick = MODELS[name]()
    dtype = torch.bfloat16 if mode.endswith("bf16") else torch.float32
    model = model.cuda().to(dtype).train(mode.startswith("train"))
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in inputs())
    stats, before = dict(extern_check.STATS), counters.snapshot()
    compiled = ember.compile(model)
    for _ in range(2):
        if mode.startswith("train"):
            pick(compiled(*args)).float().sum().backward()
        else:
            with torch.no_grad():
                pick(compiled(*args))
    torch.cuda.synchronize()
    assert extern_check.STATS["mismatches"] == stats["mismatches"], extern_check.STATS
    assert (counters.snapshot() - before)["eager_fallbacks.native_extern_meta"] == 0
    assert extern_check.STATS["passed"] > stats["passed"], extern_check.STATS
