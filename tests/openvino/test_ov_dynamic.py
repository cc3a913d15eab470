"""The openvino backend under dynamic shapes: one frontend compile and one OpenVINO ``compile_model`` per
partition serve every size. Eager PyTorch is the oracle for every output, at every size."""
import copy
import re

import pytest

from tests.openvino.conftest import require_openvino  # noqa: E402

require_openvino()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ember  # noqa: E402
from tests.openvino.helpers import F32, rel_err  # noqa: E402


@pytest.fixture
def ov_compiles(monkeypatch):
    """Counts OpenVINO ``compile_model`` calls (partitions and replayed cache records)."""
    from ember.backends.openvino import convert, fastpath

    calls = []
    real = convert.core()

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def compile_model(self, model, *args, **kwargs):
            if model.get_friendly_name() != "ember_config_probe":  # options.check_against_runtime's
                calls.append(model)
            return real.compile_model(model, *args, **kwargs)

    monkeypatch.setattr(convert, "core", lambda: Counting())
    monkeypatch.setattr(fastpath, "core", lambda: Counting())
    return calls


def _compiles(fn) -> int:
    return fn._ember_cache.compile_count


def _partitions(reports) -> list:
    return [p for r in reports for p in r["partitions"]]


def check_sizes(model, inputs, options=F32, dynamic=True, tol=1e-4):
    """Compile ``model``, run it on each input (a tensor or an argument tuple), compare with eager."""
    compiled = ember.compile(model, backend="openvino", dynamic=dynamic, options=options)
    with torch.no_grad():
        for args in inputs:
            args = args if isinstance(args, tuple) else (args,)
            got, expected = compiled(*args), model(*args)
            assert got.shape == expected.shape
            assert rel_err(got, expected) < tol, [a.shape if isinstance(a, torch.Tensor) else a for a in args]
    return compiled


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()


def convnet():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 4)).eval()


def encoder_layer():
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()


# ---- one compile for every size ---------------------------------------------------------------------

@pytest.mark.parametrize("make, shapes", [
    (mlp, [(3, 16), (7, 16), (32, 16), (5, 16)]),
    (convnet, [(2, 3, 8, 8), (5, 3, 8, 8), (3, 3, 8, 8)]),                 # dynamic batch
    (encoder_layer, [(2, 5, 32), (2, 9, 32), (2, 17, 32), (2, 6, 32)]),   # dynamic sequence length
], ids=["mlp", "convnet", "encoder_layer"])
def test_one_compile_serves_every_size(make, shapes, reports, ov_compiles):
    model = make()
    if make is convnet:  # the spatial size stays static: only the batch changes
        inputs = []
        for s in shapes:
            x = torch.randn(*s)
            ember.mark_dynamic(x, 0)
            inputs.append(x)
        compiled = check_sizes(model, inputs, dynamic=False)
    else:
        compiled = check_sizes(model, [torch.randn(*s) for s in shapes])
    assert _compiles(compiled) == 1
    [report] = reports()
    assert report["fully_converted"], report
    assert report["dynamic_inputs"], report
    assert len(ov_compiles) == len(_partitions(reports())) == 1
    assert all(p["dynamic_inputs"] for p in _partitions(reports()))


def test_transformer_sequence_length_stays_in_one_partition(reports):
    """Shape arithmetic between the layer's views runs in Python: it must not cut the partition."""
    check_sizes(encoder_layer(), [torch.randn(2, s, 32) for s in (3, 8)])
    [report] = reports()
    assert len(report["partitions"]) == 1 and report["torch_ops"] == [], report
    assert "aten.sym_size.int" in report["size_ops"]
    assert report["dynamic_inputs"] == {"primals_1": report["dynamic_inputs"]["primals_1"]}
    assert re.fullmatch(r"f32\[s\d+, s\d+, 32\]", report["dynamic_inputs"]["primals_1"])
    # the partition takes the input with a symbolic size, and the sizes it needs as ints
    [part] = report["partitions"]
    assert any(text.startswith("int ") for text in part["dynamic_inputs"].values())


def test_automatic_dynamic_compiles_twice_then_never(reports, ov_compiles):
    """dynamic=None: the first compile is static; the first size change makes the frame dynamic."""
    compiled = check_sizes(encoder_layer(), [torch.randn(2, s, 32) for s in range(2, 12)], dynamic=None)
    assert _compiles(compiled) == 2
    static, dynamic = reports()
    assert not static["dynamic_inputs"] and dynamic["dynamic_inputs"]
    assert len(ov_compiles) == len(_partitions(reports())) == 2


def test_hf_gpt2_over_several_lengths(reports, ov_compiles):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    compiled = ember.compile(model, backend="openvino", dynamic=True, options=F32)
    with torch.no_grad():
        for s in (3, 5, 8, 13, 21, 34):
            ids = torch.randint(0, 100, (2, s))
            got = compiled(input_ids=ids, use_cache=False).logits
            assert rel_err(got, model(input_ids=ids, use_cache=False).logits) < 1e-4, s
    assert _compiles(compiled) == 1
    [report] = reports()
    assert report["fully_converted"], report
    assert len(ov_compiles) == len(report["partitions"]) == 1


# ---- symbols: bounds, ints ----------------------------------------------------------------------------

def test_mark_dynamic_bounds_become_openvino_dimension_ranges(reports, ov_compiles):
    model = mlp()
    x = torch.randn(8, 16)
    ember.mark_dynamic(x, 0, min=2, max=64)
    compiled = check_sizes(model, [x, torch.randn(30, 16), torch.randn(64, 16)], dynamic=False)
    assert _compiles(compiled) == 1
    [part] = _partitions(reports())
    assert list(part["symbol_ranges"].values()) == [[2, 64]]
    [model_ir] = ov_compiles
    assert str(model_ir.inputs[0].get_partial_shape()) == "[2..64,16]"
    with torch.no_grad():
        compiled(torch.randn(65, 16))  # outside the bounds: a new entry, as the guards say
    assert _compiles(compiled) == 2


def test_int_argument_made_symbolic(reports, ov_compiles):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def f(x, n):
        return (lin(x)[:, :n] * 2).reshape(-1).relu() + n

    calls = [(torch.randn(b, 8), n) for b, n in ((4, 3), (6, 5), (9, 2), (5, 7))]
    compiled = check_sizes(f, calls)
    assert _compiles(compiled) == 1
    [report] = reports()
    assert report["fully_converted"], report
    assert any(t.startswith("int s") for t in report["dynamic_inputs"].values()), report["dynamic_inputs"]
    assert len(ov_compiles) == 1


def test_outputs_of_other_sizes_are_not_overwritten():
    compiled = ember.compile(mlp(), backend="openvino", dynamic=True, options=F32)
    xs = [torch.randn(s, 16) for s in (3, 5, 3, 5, 7)]
    with torch.no_grad():
        outs = [compiled(x) for x in xs]
        expected = [mlp()(x) for x in xs]
    for got, want in zip(outs, expected):
        assert rel_err(got, want) < 1e-4


# ---- training ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, shapes", [
    (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), [(3, 16), (7, 16), (5, 16)]),
    (lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), [(2, 5, 32), (2, 9, 32)]),
], ids=["mlp", "encoder_layer"])
def test_training_with_aot_autograd_and_changing_sizes(make, shapes, reports):
    torch.manual_seed(0)
    model = make()
    reference = copy.deepcopy(model)
    compiled = ember.compile(model, backend="openvino", dynamic=True, options={**F32, "aot_autograd": True})
    for s in shapes:
        x = torch.randn(*s)
        y, y_ref = compiled(x), reference(x)
        # a random projection: the sum of squares of a layer-normed output is nearly constant, and
        # its tiny gradients would be all rounding noise
        w = torch.randn_like(y_ref)
        (y * w).sum().backward()
        (y_ref * w).sum().backward()
        assert rel_err(y, y_ref) < 1e-4
        for p, q in zip(model.parameters(), reference.parameters()):
            assert rel_err(p.grad, q.grad) < 1e-3, s
            p.grad = q.grad = None
    assert _compiles(compiled) == 1
    # one forward and one backward graph, both with symbolic sizes, both (partly) in OpenVINO
    assert len(reports()) == 2 and all(r["dynamic_inputs"] for r in reports())
    assert any(r["partitions"] for r in reports())


# ---- model caching ----------------------------------------------------------------------------------

def test_model_cache_keys_dynamic_graphs_by_their_symbols(tmp_path, reports, ov_compiles):
    """A second compile of the same dynamic graph hits the cache even though its first call has another
    size; a static compile of the same model does not hit the dynamic entries."""
    options = {**F32, "model_caching": True, "cache_dir": str(tmp_path)}
    encoder = encoder_layer()
    check_sizes(encoder, [torch.randn(2, s, 32) for s in (4, 7)], options=options)
    check_sizes(encoder, [torch.randn(2, s, 32) for s in (11, 5)], options=options)
    check_sizes(encoder, [torch.randn(2, 11, 32)], options=options, dynamic=False)
    assert [p["cache_hit"] for p in _partitions(reports())] == [False, True, False]

    # a graph that is one partition is recorded whole and replayed without tracing
    model = mlp()
    check_sizes(model, [torch.randn(3, 16), torch.randn(6, 16)], options=options)
    before = len(reports())
    replayed = check_sizes(model, [torch.randn(9, 16), torch.randn(2 + 2, 16), torch.randn(40, 16)], options=options)
    assert len(reports()) == before  # nothing traced or partitioned
    assert _compiles(replayed) == 1


# ---- openvino_ts ------------------------------------------------------------------------------------

def test_openvino_ts_traces_once_per_shape():
    model = mlp()
    compiled = ember.compile(model, backend="openvino_ts", dynamic=True, options=F32)
    with torch.no_grad():
        for b in (3, 5, 3):
            x = torch.randn(b, 16)
            assert rel_err(compiled(x), model(x)) < 1e-4
    assert _compiles(compiled) == 1
