"""The options of the ``openvino`` backend: declared once, resolved once per compile.

Precedence, per key: an explicit ``options={...}`` entry, then the environment variable (for the three
keys that have one), then the built-in default. Every check raises with the valid choices spelled out:
a typo must never turn into a silently ignored setting.

This module does not import openvino; ``check_against_runtime`` (device names, property names and
values) runs at the first compile, when openvino is loaded anyway.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ember.backends.options import BackendOptions, option
from ember.config import environment

ENV_DEVICE = "OPENVINO_TORCH_BACKEND_DEVICE"
ENV_MODEL_CACHING = "OPENVINO_TORCH_MODEL_CACHING"
ENV_CACHE_DIR = "OPENVINO_TORCH_CACHE_DIR"

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")

# Every field defaults to None, "not given": the environment variable (for the three that have one) or
# the built-in default applies, in ``resolve``. The types are checked at ember.compile (registry).
_FIELDS = {
    "device": lambda: option(None, f"OpenVINO device for the converted partitions ('CPU'); env {ENV_DEVICE}",
                             accepts=(str,), kind="str"),
    "aot_autograd": lambda: option(None, "keep parameters and buffers as runtime inputs instead of folding them "
                                         "into OpenVINO constants (fine-tuning: weights may change between calls "
                                         "at no cost)", accepts=(bool, str), kind="bool"),
    "model_caching": lambda: option(None, f"save converted partitions under cache_dir and reuse them in later "
                                          f"processes; env {ENV_MODEL_CACHING}", accepts=(bool, str), kind="bool"),
    "cache_dir": lambda: option(None, f"where model_caching writes (default ./cache); env {ENV_CACHE_DIR}",
                                accepts=(str, os.PathLike), kind="str or os.PathLike"),
    "decompositions": lambda: option(None, "extra ATen ops (OpOverload/OpOverloadPacket) to decompose before "
                                           "conversion", accepts=(list, tuple), kind="list"),
    "disabled_ops": lambda: option(None, "ATen ops kept in PyTorch: OpOverload objects or names like "
                                         "'torch.ops.aten.relu.default', 'aten.relu.default', 'aten.relu'",
                                   accepts=(list, tuple, set, frozenset), kind="list"),
    "config": lambda: option(None, "OpenVINO properties for compile_model, e.g. "
                                   "{'INFERENCE_PRECISION_HINT': 'f32'}", accepts=(dict,), kind="dict"),
}


@dataclass(frozen=True, eq=False)
class OpenVINOOptions(BackendOptions):
    """The options of the ``openvino`` backend, as given (``resolve`` turns them into ``OVOptions``)."""
    backend: ClassVar[str] = "openvino"

    device: str | None = _FIELDS["device"]()
    aot_autograd: bool | str | None = _FIELDS["aot_autograd"]()
    model_caching: bool | str | None = _FIELDS["model_caching"]()
    cache_dir: str | None = _FIELDS["cache_dir"]()
    decompositions: list | None = _FIELDS["decompositions"]()
    disabled_ops: list | None = _FIELDS["disabled_ops"]()
    config: dict | None = _FIELDS["config"]()


@dataclass(frozen=True, eq=False)
class OpenVINOTSOptions(BackendOptions):
    """The options of ``openvino_ts``: TorchScript has no partitions, so no op lists or weight handling."""
    backend: ClassVar[str] = "openvino_ts"

    device: str | None = _FIELDS["device"]()
    model_caching: bool | str | None = _FIELDS["model_caching"]()
    cache_dir: str | None = _FIELDS["cache_dir"]()
    config: dict | None = _FIELDS["config"]()


@dataclass(frozen=True)
class OVOptions:
    device: str = "CPU"
    freeze_weights: bool = True          # False when aot_autograd is on
    model_caching: bool = False
    cache_dir: str = "./cache"
    decompositions: dict = field(default_factory=dict, hash=False, compare=False)
    disabled_ops: frozenset = frozenset()   # canonical names: "aten.relu.default" or "aten.relu" (a packet)
    config: tuple = ()                     # sorted (property, value-as-string) pairs

    @property
    def config_dict(self) -> dict:
        return dict(self.config)

    def cache_fingerprint(self) -> str:
        """What of these options changes a converted or compiled model (cache keys include it)."""
        return f"device={self.device};freeze={self.freeze_weights};config={self.config}"


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"openvino option {key!r} must be a bool (or one of {_TRUE + _FALSE[:-1]}), got {value!r}")


def op_name(op) -> str:
    """Canonical name of an ATen op: 'aten.relu.default' for an overload, 'aten.relu' for a packet.
    Accepts the objects and the spellings people write ('torch.ops.aten.relu.default')."""
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        text = str(op)
    elif isinstance(op, str):
        text = op.strip()
    else:
        raise TypeError(f"openvino option 'disabled_ops' takes OpOverloads or op names, got {type(op).__name__} "
                        f"({op!r})")
    return text[len("torch.ops."):] if text.startswith("torch.ops.") else text


def _check_op_name(name: str) -> None:
    parts = name.split(".")
    if len(parts) not in (2, 3):
        raise ValueError(f"openvino option 'disabled_ops': {name!r} is not an op name; write e.g. "
                         "'aten.relu.default' (one overload) or 'aten.relu' (all overloads)")
    packet = getattr(getattr(torch.ops, parts[0], None), parts[1], None)
    if packet is None or (len(parts) == 3 and parts[2] not in packet.overloads()):
        raise ValueError(f"openvino option 'disabled_ops': no op named {name!r}"
                         + (f"; overloads of {parts[0]}.{parts[1]}: {', '.join(packet.overloads())}"
                            if packet is not None else ""))


def _decompositions(ops) -> dict:
    from torch._decomp import get_decompositions
    table = {}
    for op in ops:
        if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(f"openvino option 'decompositions' takes OpOverloads (torch.ops.aten.x.default) "
                            f"or packets, got {type(op).__name__} ({op!r})")
        found = get_decompositions([op])
        if not found:
            raise ValueError(f"openvino option 'decompositions': torch has no decomposition registered for {op}")
        table.update(found)
    return table


def resolve(options=None) -> OVOptions:
    """The effective options of one compile. ``options``: the checked ``OpenVINOOptions`` (or
    ``OpenVINOTSOptions``) that ember.compile passes, or a dict from a caller that reaches the backend
    function directly (torch.compile, tests): checked here then, with the same errors."""
    if not isinstance(options, BackendOptions):
        options = OpenVINOOptions.from_dict(options)
    options = {k: v for k, v in options.as_dict().items() if v is not None}

    def given(key, env=None):
        value = options.get(key)
        if value is None and env is not None:
            value = environment.get(env)
        return value

    device = given("device", ENV_DEVICE) or "CPU"
    caching = given("model_caching", ENV_MODEL_CACHING)
    config = options.get("config") or {}
    for k in config:
        if not isinstance(k, str):
            raise TypeError(f"openvino option 'config' keys are OpenVINO property names (str), got {k!r}")
    # OpenVINO's own CACHE_DIR property wins over cache_dir, as in OpenVINO's integration
    cache_dir = str(config.get("CACHE_DIR") or given("cache_dir", ENV_CACHE_DIR) or "./cache")
    disabled = frozenset(op_name(op) for op in (options.get("disabled_ops") or ()))
    for name in disabled:
        _check_op_name(name)
    return OVOptions(
        device=str(device).strip(),
        freeze_weights=not _flag("aot_autograd", options.get("aot_autograd") or False),
        model_caching=_flag("model_caching", caching) if caching is not None else False,
        cache_dir=os.fspath(cache_dir),
        decompositions=_decompositions(options.get("decompositions") or ()),
        disabled_ops=disabled,
        config=tuple(sorted((k, str(v)) for k, v in config.items())),
    )


# Properties that belong to the Core, not a device; compile_model accepts them in its config too.
_CORE_PROPERTIES = {"CACHE_DIR", "CACHE_MODE", "ENABLE_MMAP", "ALLOW_AUTO_BATCHING", "AUTO_BATCH_TIMEOUT"}
_checked: set = set()


def check_against_runtime(opts: OVOptions, core) -> None:
    """Device and properties checked by OpenVINO itself, once per process and setting: an unknown device,
    property name or value raises here instead of making every partition fall back to PyTorch."""
    key = (opts.device, opts.config)
    if key in _checked:
        return
    devices = core.available_devices
    if opts.device.split(".")[0].split(":")[0] not in {d.split(".")[0] for d in devices} \
            and not opts.device.startswith(("AUTO", "HETERO", "MULTI")):
        raise ValueError(f"openvino option 'device': {opts.device!r} is not available; devices here: "
                         f"{', '.join(devices)}")
    if opts.config:
        supported = core.get_property(opts.device.split(":")[0], "SUPPORTED_PROPERTIES")
        writable = {k for k, mode in supported.items() if mode != "RO"} | _CORE_PROPERTIES
        bad = sorted(k for k, _ in opts.config if k not in writable)
        if bad:
            raise ValueError(f"openvino option 'config': unknown or read-only propert{'ies' if len(bad) > 1 else 'y'} "
                             f"{', '.join(map(repr, bad))} for device {opts.device!r}; valid: {', '.join(sorted(writable))}")
        _probe_values(opts, core)
    _checked.add(key)


def _probe_values(opts: OVOptions, core) -> None:
    """Compile a one-op model with the config, so a bad value (PERFORMANCE_HINT='FAST') names itself."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([1], np.float32)
    probe = ov.Model([ops.relu(x)], [x], "ember_config_probe")
    config = {k: v for k, v in opts.config if k not in ("CACHE_DIR", "CACHE_MODE")}
    try:
        core.compile_model(probe, opts.device, config)
    except Exception as exc:  # noqa: BLE001 - OpenVINO raises a plain RuntimeError; re-raise as a user error
        raise ValueError(f"openvino option 'config' {config} was rejected by OpenVINO for device "
                         f"{opts.device!r}: {str(exc).strip().splitlines()[-1]}") from exc
