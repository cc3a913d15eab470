"""Backends declare their options as one frozen dataclass (``ember.backends.options.BackendOptions``);
``ember.compile(options=...)`` is checked against its fields (unknown key: did-you-mean and the valid
names; wrong type or range: the field and what it means) and the backend receives the checked object."""
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import ember
from ember.backends import registry
from ember.backends.openvino import options as ov_options
from ember.backends.options import BackendOptions, option


@dataclass(frozen=True)
class BlockOptions(BackendOptions):
    backend: ClassVar[str] = "with_blocks"
    block: int = option(128, "largest block", min=1)
    fast: bool = option(False, "skip the checks")
    where: str | None = option(None, "a directory", accepts=(str,))


received = []


def _backend(gm, example_inputs, options=None):
    received.append(options)
    return gm.forward


@pytest.fixture(autouse=True)
def _registered():
    ember.register_backend(_backend, name="with_blocks", options=BlockOptions)
    received.clear()
    yield
    registry._BACKENDS.pop("with_blocks", None)


@pytest.mark.parametrize("options, error, match", [
    ({"blok": 1}, ValueError, r"unknown option\(s\) 'blok' for backend 'with_blocks' \(did you mean 'block'\?\); "
                              r"valid options: block, fast, where \(and 'guard_filter_fn'"),
    ({"block": "8"}, TypeError, r"option 'block' of backend 'with_blocks' must be int, got str \('8'\) "
                                r"\(block: largest block\)"),
    ({"block": True}, TypeError, r"option 'block' .* must be int, got bool"),
    ({"fast": 1}, TypeError, r"option 'fast' .* must be bool, got int"),
    ({"where": 3}, TypeError, r"option 'where' .* must be str"),
    ({"block": 0}, ValueError, r"option 'block' of backend 'with_blocks' must be >= 1, got 0"),
])
def test_bad_options_fail_at_ember_compile(options, error, match):
    with pytest.raises(error, match=match):
        ember.compile(lambda x: x + 1, backend="with_blocks", options=options)


def test_the_backend_receives_the_checked_object():
    f = ember.compile(lambda x: x + 1, backend="with_blocks", options={"block": 8})
    torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 2.0))
    assert received == [BlockOptions(block=8)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        received[0].block = 1


def test_openvino_options_are_declared_as_dataclasses():
    """The openvino backends declare their keys as dataclass fields, each documented; ember.compile
    hands them the checked object (no openvino import needed for any of this)."""
    spec = registry.backend_spec("openvino")
    assert spec.options is ov_options.OpenVINOOptions
    assert registry.backend_spec("openvino_ts").options is ov_options.OpenVINOTSOptions
    got = registry.validate_options(spec, {"device": "CPU", "aot_autograd": True})
    assert isinstance(got, ov_options.OpenVINOOptions) and (got.device, got.aot_autograd) == ("CPU", True)
    for cls in (ov_options.OpenVINOOptions, ov_options.OpenVINOTSOptions):
        assert all(f.metadata["doc"] for f in dataclasses.fields(cls))
    assert set(ov_options.OpenVINOTSOptions.names()) < set(ov_options.OpenVINOOptions.names())
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'disabled_ops' for backend 'openvino_ts'"):
        registry.validate_options(registry.backend_spec("openvino_ts"), {"disabled_ops": []})


def test_openvino_resolve_takes_the_checked_object_or_a_dict(monkeypatch):
    monkeypatch.delenv("OPENVINO_TORCH_BACKEND_DEVICE", raising=False)
    checked = ov_options.OpenVINOOptions(device="GPU", model_caching="yes")
    a, b = ov_options.resolve(checked), ov_options.resolve({"device": "GPU", "model_caching": "yes"})
    assert (a.device, a.model_caching) == (b.device, b.model_caching) == ("GPU", True)
    assert ov_options.resolve(ov_options.OpenVINOTSOptions(device="CPU")).freeze_weights is True
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'devcie' for backend 'openvino' \(did you mean"):
        ov_options.resolve({"devcie": "CPU"})
