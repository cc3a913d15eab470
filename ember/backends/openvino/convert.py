"""One partition (a small ATen GraphModule) -> an OpenVINO model compiled for a device.

The route is OpenVINO's PyTorch frontend fed by its FX decoder: ``TorchFXPythonDecoder(gm)`` walks the
graph's nodes, ``FrontEnd.load`` / ``FrontEnd.convert`` build an ``ov.Model``, ``Core.compile_model``
compiles it. Values the partition reads but does not compute (frozen weights, constants lifted by
``make_fx``) become ``get_attr`` nodes first, so OpenVINO sees them as constants it can fold and
pre-pack, instead of inputs it must read on every call.
"""
from __future__ import annotations

import functools
import time
import warnings

import torch
import torch.fx as fx

from ember.backends.openvino import cache
from ember.backends.openvino.options import OVOptions
from ember.backends.openvino.threads import compile_config
from ember.backends.openvino.support import unconvertible_ops


class UnconvertibleOps(Exception):
    """OpenVINO's converter has no rule for these ops (names as ``str(node.target)``)."""

    def __init__(self, names: set[str], message: str):
        super().__init__(f"no OpenVINO conversion for {', '.join(sorted(names))}")
        self.names, self.message = names, message


def _import_openvino():
    try:
        import openvino
        from openvino.frontend import FrontEndManager
        from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder
    except ImportError as exc:
        raise ImportError("ember's 'openvino' backend needs the openvino package: pip install 'ember[openvino]' "
                          f"(or pip install openvino); importing it failed: {exc}") from exc
    return openvino, FrontEndManager, TorchFXPythonDecoder


@functools.lru_cache(maxsize=1)
def core():
    """One OpenVINO Core per process: it owns the loaded device plugins and their thread pools."""
    ov, _, _ = _import_openvino()
    return ov.Core()


def openvino_version() -> str:
    ov, _, _ = _import_openvino()
    return ov.get_version()


def bake_constants(sub: fx.GraphModule, constants: dict[int, torch.Tensor]) -> fx.GraphModule:
    """Turn the placeholders at the given positions into ``get_attr`` constants (tensors detached: the
    decoder shares their memory and must not see autograd state)."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for k, value in sorted(constants.items()):
        node = placeholders[k]
        name = f"ov_const_{k}"
        sub.register_buffer(name, value.detach())
        with sub.graph.inserting_before(node):
            attr = sub.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        sub.graph.erase_node(node)
    sub.recompile()
    return sub


def input_specs(sub: fx.GraphModule) -> list[tuple[tuple, torch.dtype]]:
    """(shape, dtype) of each remaining placeholder, read from the traced metadata."""
    specs = []
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            val = node.meta["val"]
            specs.append((tuple(int(d) for d in val.shape), val.dtype))
    return specs


def output_specs(sub: fx.GraphModule) -> list[tuple[tuple, torch.dtype]]:
    out = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
    return [(tuple(int(d) for d in a.meta["val"].shape), a.meta["val"].dtype) for a in out.args[0]]


def to_ov_model(sub: fx.GraphModule):
    """Convert with the FX decoder; ``UnconvertibleOps`` when the converter names ops it cannot handle."""
    _, FrontEndManager, TorchFXPythonDecoder = _import_openvino()
    specs = input_specs(sub)
    frontend = FrontEndManager().load_by_framework("pytorch")
    # The decoder must stay referenced while the frontend works on it: a temporary fails with
    # "pure virtual function called" (OpenVINO keeps a raw pointer to it).
    decoder = TorchFXPythonDecoder(sub, input_shapes=[torch.Size(s) for s, _ in specs],
                                   input_types=[d for _, d in specs])
    try:
        model = frontend.convert(frontend.load(decoder))
    except Exception as exc:  # noqa: BLE001 - OpConversionFailure is not importable by a stable name
        names = unconvertible_ops(str(exc))
        if names:
            raise UnconvertibleOps(names, str(exc)) from exc
        raise
    del decoder
    return model


def compile_partition(sub: fx.GraphModule, opts: OVOptions, log) -> tuple:
    """(compiled model, input specs, output specs, cache key or None, cache hit) for one partition
    whose constants are already baked in (``bake_constants``)."""
    t0 = time.perf_counter()
    ins, outs = input_specs(sub), output_specs(sub)
    key = cache.partition_key(sub, ins, opts, openvino_version()) if opts.model_caching else None
    model = cache.load_model(core(), opts.cache_dir, key) if key else None
    hit = model is not None
    if model is None:
        model = to_ov_model(sub)
        if key:
            cache.save_model(model, opts.cache_dir, key)
    config = compile_config(opts)
    if opts.model_caching and "CACHE_DIR" not in config:
        config["CACHE_DIR"] = cache.blob_dir(opts.cache_dir)  # OpenVINO's own cache of compiled blobs
    compiled = core().compile_model(model, opts.device, config)
    _note_precision(compiled, opts)
    if len(compiled.outputs) != len(outs):
        raise RuntimeError(f"OpenVINO model has {len(compiled.outputs)} outputs, the partition {len(outs)}")
    log(f"{'loaded from the cache' if hit else 'converted'}, compiled in {time.perf_counter() - t0:.3f}s")
    return compiled, ins, outs, key, hit


_precision_noted = False


def _note_precision(compiled, opts: OVOptions) -> None:
    """Say once per process when OpenVINO chose a lower precision than fp32 on its own (bf16 on CPUs
    with bf16 units): results then differ from eager by up to ~1e-2 relative (docs/openvino.md)."""
    global _precision_noted
    if _precision_noted or "INFERENCE_PRECISION_HINT" in opts.config_dict:
        return
    try:
        precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    except Exception:  # noqa: BLE001 - a device without the property
        return
    if "32" not in precision:
        _precision_noted = True
        warnings.warn(f"ember openvino: {opts.device} computes float32 models in {precision} by default; "
                      "results differ from eager by up to ~1e-2 relative. For float32 results pass "
                      "options={'config': {'INFERENCE_PRECISION_HINT': 'f32'}}.", stacklevel=2)
