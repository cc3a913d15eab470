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
from ember.backends.openvino.shapes import Signature
from ember.backends.openvino.threads import compile_config
from ember.backends.openvino.support import CONVERTER_INTERNALS, short_outputs, unconvertible_ops


class UnconvertibleOps(Exception):
    """OpenVINO's converter has no rule for these ops (names as ``str(node.target)``), or gives these
    multi-output ops fewer outputs than PyTorch (``short``: op name -> outputs it gives)."""

    def __init__(self, names: set[str], message: str, short: dict[str, int] | None = None):
        short = short or {}
        parts = [f"no OpenVINO conversion for {', '.join(sorted(names))}"] if names else []
        parts += [f"OpenVINO converts only {n} output(s) of {op}" for op, n in sorted(short.items())]
        super().__init__("; ".join(parts))
        self.names, self.message, self.short = names, message, short


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


def bake_constants(sub: fx.GraphModule, constants: dict[int, torch.Tensor | int]) -> fx.GraphModule:
    """Turn the placeholders at the given positions into ``get_attr`` constants (tensors detached: the
    decoder shares their memory and must not see autograd state), or into literals (ints: sizes that
    tracing found static, read by ``aten.sym_size`` all the same)."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for k, value in sorted(constants.items()):
        node = placeholders[k]
        if not isinstance(value, torch.Tensor):
            for user in list(node.users):
                user.args, user.kwargs = fx.node.map_aggregate((user.args, user.kwargs),
                                                               lambda a: value if a is node else a)
            sub.graph.erase_node(node)
            continue
        name = f"ov_const_{k}"
        sub.register_buffer(name, value.detach())
        with sub.graph.inserting_before(node):
            attr = sub.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        sub.graph.erase_node(node)
    sub.recompile()
    return sub


def signature(sub: fx.GraphModule) -> Signature:
    """What the partition takes (its remaining placeholders) and returns, read from the traced metadata
    without guarding on symbolic sizes (an ``int()`` would specialize them)."""
    nodes = list(sub.graph.nodes)
    out = next(n for n in reversed(nodes) if n.op == "output")
    return Signature.of([n.meta["val"] for n in nodes if n.op == "placeholder"],
                        [a.meta["val"] for a in out.args[0]])


def to_ov_model(sub: fx.GraphModule, sig: Signature):
    """Convert with the FX decoder; ``UnconvertibleOps`` when the converter names ops it cannot handle."""
    _, FrontEndManager, TorchFXPythonDecoder = _import_openvino()
    frontend = FrontEndManager().load_by_framework("pytorch")
    # The decoder must stay referenced while the frontend works on it: a temporary fails with
    # "pure virtual function called" (OpenVINO keeps a raw pointer to it).
    if sig.dynamic:
        shapes = sig.partial_shapes()
    else:
        shapes = [torch.Size(s.shape) for s in sig.inputs]
    decoder = TorchFXPythonDecoder(sub, input_shapes=shapes, input_types=[s.dtype for s in sig.inputs])
    try:
        model = frontend.convert(frontend.load(decoder))
    except Exception as exc:  # noqa: BLE001 - OpConversionFailure is not importable by a stable name
        names = unconvertible_ops(str(exc))
        short = short_outputs(str(exc), sub)
        if short:
            names -= CONVERTER_INTERNALS  # the getitem and its list type failed because outputs were missing
        if names or short:
            raise UnconvertibleOps(names, str(exc), short) from exc
        raise
    del decoder
    return model


def compile_partition(sub: fx.GraphModule, opts: OVOptions, log) -> tuple:
    """(compiled model, signature, cache key or None, cache hit) for one partition whose constants
    are already baked in (``bake_constants``). With symbolic sizes the model has dynamic dimensions
    and is compiled once for all of them (shapes.py)."""
    t0 = time.perf_counter()
    sig = signature(sub)
    key = cache.partition_key(sub, sig.key_text(), opts, openvino_version()) if opts.model_caching else None
    model = cache.load_model(core(), opts.cache_dir, key) if key else None
    hit = model is not None
    if model is None:
        model = to_ov_model(sub, sig)
        if key:
            cache.save_model(model, opts.cache_dir, key)
    config = compile_config(opts)
    if opts.model_caching and "CACHE_DIR" not in config:
        config["CACHE_DIR"] = cache.blob_dir(opts.cache_dir)  # OpenVINO's own cache of compiled blobs
    compiled = core().compile_model(model, opts.device, config)
    _note_precision(compiled, opts)
    if len(compiled.outputs) != len(sig.outputs):
        raise RuntimeError(f"OpenVINO model has {len(compiled.outputs)} outputs, the partition {len(sig.outputs)}")
    dynamic = f" with dynamic inputs {sig.dynamic_inputs()}" if sig.dynamic else ""
    log(f"{'loaded from the cache' if hit else 'converted'}{dynamic}, compiled in {time.perf_counter() - t0:.3f}s")
    return compiled, sig, key, hit


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
