"""The native backend's options are one typed object (``NativeOptions``): each setting has one default
wherever it is read, and a misspelled key, a wrong type or an out-of-range value is an error naming the
field, never a silently ignored setting."""
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from ember.config import environment  # noqa: E402
from ember.native import autotune, backend, build_pool  # noqa: E402
from ember.native.options import NativeOptions, resolve  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402


def _configs(fn, inputs, options):
    _, _, _, emitted = backend.plan(trace(fn, inputs), inputs, options)
    return [(ek.config.XBLOCK, ek.config.RBLOCK, ek.config.num_warps) for _, ek in emitted]


@pytest.mark.parametrize("fn, shape", [
    (lambda x: torch.softmax(x * 0.125, -1), (4, 8192)),   # persistent rows up to max_rblock
    (lambda x: x.sum(-1), (3, 5000)),
    (lambda x: (x * 2).relu(), (64, 70)),
    (lambda x: x.sum(0), (300, 16)),
])
def test_every_reader_sees_the_same_defaults(fn, shape):
    """plan() with no options, an empty dict, or the defaults spelled out gives the same kernels
    (before: the emitter's own fallback capped reduction blocks at 4096, the defaults at 8192)."""
    x = torch.randn(*shape, device=DEVICE)
    expected = _configs(fn, [x], NativeOptions())
    assert _configs(fn, [x], {}) == expected
    assert _configs(fn, [x], dict(backend.DEFAULT_OPTIONS)) == expected


@pytest.mark.parametrize("options, error, match", [
    ({"max_rblok": 16}, ValueError, r"unknown option\(s\) 'max_rblok' for backend 'ember' \(did you mean "
                                    r"'max_rblock'\?\); valid options: autotune, cache, .*small_mm_flops"),
    ({"num_warps": 8}, ValueError, r"unknown option\(s\) 'num_warps'"),
    ({"max_xblock": "16"}, TypeError, r"option 'max_xblock' of backend 'ember' must be int, got str \('16'\) "
                                      r"\(max_xblock: largest block"),
    ({"fusion": 1}, TypeError, r"option 'fusion' of backend 'ember' must be bool, got int"),
    ({"small_mm_flops": True}, TypeError, r"option 'small_mm_flops' .* must be int, got bool"),
    ({"cache_dir": 3}, TypeError, r"option 'cache_dir' .* must be str"),
    ({"max_rblock": 0}, ValueError, r"option 'max_rblock' of backend 'ember' must be >= 1, got 0"),
    ({"small_mm_flops": -1}, ValueError, r"option 'small_mm_flops' .* must be >= 0"),
])
def test_bad_options_are_errors_naming_the_field(options, error, match):
    x = torch.randn(4, 8, device=DEVICE)
    gm = trace(lambda x: x.sin(), [x])
    with pytest.raises(error, match=match):
        backend.compile_aten_graph(gm, [x], force_triton=True, options={"cache": False, **options})
    with pytest.raises(error, match=match):  # on CPU tensors without Triton too: the options are still wrong
        backend.compile_aten_graph(gm, [x], force_triton=False, options={"cache": False, **options})


def test_options_are_frozen_resolved_once_and_take_the_config_default(monkeypatch):
    import ember
    opts = resolve({"max_xblock": 64})
    assert resolve(opts) is opts
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.max_xblock = 8
    monkeypatch.setattr(ember.config, "emulate_precision_casts", True)
    assert resolve({}).emulate_precision_casts is True
    assert resolve({"emulate_precision_casts": False}).emulate_precision_casts is False
    assert "cache_dir" not in NativeOptions(cache_dir="/x").cache_key()


def test_every_field_is_documented():
    for f in dataclasses.fields(NativeOptions):
        assert f.metadata["doc"], f.name
    assert backend.DEFAULT_OPTIONS == NativeOptions().as_dict()


@pytest.mark.parametrize("spelling", ["1", "true", "True", "yes", "on", "y"])
def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch, spelling):
    """Triton runs its interpreter for TRITON_INTERPRET=true as for =1; ember must agree (before, only
    "1" counted: a build pool and device timing were started for kernels the interpreter runs)."""
    monkeypatch.setenv("TRITON_INTERPRET", spelling)
    assert environment.triton_interpret
    monkeypatch.setattr(build_pool, "_POOL", None)
    assert build_pool.start(8) is None
    assert autotune.skip_reason("cpu") == "the Triton interpreter cannot time kernels"


@pytest.mark.parametrize("spelling", ["0", "false", "", "2"])
def test_triton_interpret_off(monkeypatch, spelling):
    monkeypatch.setenv("TRITON_INTERPRET", spelling)
    assert not environment.triton_interpret


def test_unknown_environment_variable_is_a_key_error():
    with pytest.raises(KeyError, match="add it to ember.config.Environment.VARIABLES"):
        environment.get("TRITON_INTERPRETER")
