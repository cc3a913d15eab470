"""``model_caching`` for whole graphs: a later process skips ATen tracing as well as conversion.

Caching converted partitions (cache.py) saves conversion, but in a fresh process most of the first
call goes into tracing the captured graph to ATen (``make_fx``: one to two seconds here). So when a
captured graph turns out to be the simplest kind, ember also writes a record keyed by the captured
(Torch-level) graph itself; a later process with the same graph, input shapes, weights and options
finds the record and goes straight to the cached OpenVINO model.

The simplest kind, the only one recorded: an inference call (no gradient needed, autocast off) whose
ATen graph became exactly one OpenVINO partition with nothing around it, and which neither mutates
nor aliases its inputs (aot_autograd's analysis says so). Anything else falls back to the full path
(aot_autograd + partitioning, with per-partition caching), as does a replayed graph at a call that
needs gradients, runs under autocast, or sees a weight changed since it was frozen. A graph with
symbolic sizes is keyed and recorded by its symbols (canonical names and ranges, shapes.py), so a later
process replays it whatever size its first call has; one whose partition takes ints (sizes computed
in Python) is not recorded.
"""
from __future__ import annotations

import hashlib

import torch
import torch.fx as fx

from ember.backends.openvino import cache
from ember.backends.openvino.convert import core, openvino_version
from ember.backends.openvino.partition import log
from ember.backends.openvino.runtime import OVPartition
from ember.backends.openvino.shapes import Signature, graph_input_positions
from ember.backends.openvino.support import is_symbolic
from ember.backends.openvino.threads import compile_config


def _plain_call(example_inputs) -> bool:
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs)
    return not needs_grad and not torch._C._is_any_autocast_enabled()


def graph_key(gm: fx.GraphModule, example_inputs: list, opts, frozen: list[int]) -> str:
    """Hash of the captured graph, its inputs' metadata, the frozen weights' bytes, the options and
    the versions involved. A graph with symbolic sizes is keyed by them (canonical names and ranges),
    not by the sizes of the call that compiled it."""
    templates = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    dynamic = any(is_symbolic(t) for t in templates)
    h = hashlib.blake2b(digest_size=32)
    for part in (cache.FORMAT, "graph", openvino_version(), torch.__version__, cache._package_source_hash(),
                 opts.cache_fingerprint(), gm.code):
        h.update(part.encode() + b"\0")
    for i, a in enumerate(example_inputs):
        if isinstance(a, torch.Tensor):
            shape = "symbolic" if dynamic else tuple(a.shape)
            h.update(f"{i}:{shape}:{a.dtype}:{a.requires_grad}:{i in frozen};".encode())
        elif dynamic and isinstance(templates[i], torch.SymInt):
            h.update(f"{i}:symbolic int;".encode())
        else:
            h.update(f"{i}:{type(a).__name__}:{a!r};".encode())
    if dynamic:
        symbolic = [t for t in templates if isinstance(t, (torch.Tensor, torch.SymInt))]
        h.update(Signature.of(symbolic, []).key_text().encode())
    for i in frozen:
        cache.tensor_digest(example_inputs[i], h)
    return h.hexdigest()


def compile_with_cache(gm: fx.GraphModule, example_inputs: list, opts, weights: set[int], aot):
    """The compiled graph, from a whole-graph record when one exists (else built and maybe recorded)."""
    if not _plain_call(example_inputs):
        return aot(gm, example_inputs)
    tensor_pos = graph_input_positions(gm, example_inputs)  # captured position of each ATen input
    frozen = sorted(tensor_pos[r] for r in weights)
    key = graph_key(gm, example_inputs, opts, frozen)
    record = cache.load_record(opts.cache_dir, key)
    if record is not None:
        try:
            return ReplayedGraph(gm, example_inputs, opts, record, aot)
        except Exception as exc:  # noqa: BLE001 - a stale or damaged entry: build normally, rewrite it
            log(f"model cache: record {key[:12]} unusable ({type(exc).__name__}: {exc}); building the graph")
    compiled = aot(gm, example_inputs)
    record = _record_for(compiled, tensor_pos)
    if record is not None:
        cache.save_record(opts.cache_dir, key, record)
        log(f"model cache: recorded graph {key[:12]} (one partition: later processes skip tracing)")
    return compiled


def _record_for(compiled, tensor_pos: list[int]) -> dict | None:
    """The replay record of a freshly built graph, if it is of the simplest kind."""
    variants = list(getattr(compiled, "variants", {}).values())
    if len(variants) != 1 or variants[0].kind != "inference":
        return None
    variant, meta = variants[0], variants[0].meta
    plain = [o.kind.value == "plain" and o.source == j for j, o in enumerate(meta.outputs)]
    if meta.mutated or meta.base_reps or not all(plain) or not meta.output_is_tuple:
        return None
    built = getattr(variant.compiled, "built", None)
    form = built.direct_form() if built is not None else None
    if form is None or not built.partitions[0].get("cache_key"):
        return None
    inputs, outputs = form
    part = built.partitions[0]
    frozen = [pos for pos, _, _ in variant.compiled.frozen]
    if set(inputs) & set(frozen) or any(spec.is_int for spec in part["signature"].inputs):
        return None
    return {
        "ir": part["cache_key"],
        "inputs": [tensor_pos[k] for k in inputs],     # captured-graph input positions fed to OpenVINO
        "outputs": outputs,                            # partition output behind each graph output
        "frozen": [tensor_pos[k] for k in frozen],     # captured-graph positions baked as constants
        "signature": part["signature"].to_json(),      # shapes, symbolic ones by canonical name
    }


class ReplayedGraph:
    """A recorded graph: one OpenVINO call, no tracing. Hands over to the full path when it must."""

    def __init__(self, gm, example_inputs: list, opts, record: dict, aot):
        model = cache.load_model(core(), opts.cache_dir, record["ir"])
        if model is None:
            raise FileNotFoundError("its OpenVINO model is missing from the cache")
        if any(not isinstance(example_inputs[i], torch.Tensor) for i in record["inputs"] + record["frozen"]):
            raise ValueError("it does not match the graph's inputs")
        config = compile_config(opts)
        config.setdefault("CACHE_DIR", cache.blob_dir(opts.cache_dir))
        sig = Signature.from_json(record["signature"])
        args = [example_inputs[i] for i in record["inputs"]]
        if not sig.accepts(args):
            raise ValueError(f"the inputs ({', '.join(f'{tuple(a.shape)} {a.dtype}' for a in args)}) do not fit "
                             f"the record's ({', '.join(s.text() for s in sig.inputs)})")
        compiled = core().compile_model(model, opts.device, config)
        self.runner = OVPartition("replayed", compiled, sig)
        self.gm, self.aot, self.full = gm, aot, None
        self.inputs, self.outputs = record["inputs"], record["outputs"]
        self.frozen = [(i, example_inputs[i], example_inputs[i]._version) for i in record["frozen"]]
        log(f"model cache: replaying a recorded graph ({len(self.frozen)} frozen weights, no tracing)")

    def __call__(self, *args):
        if self.full is None:
            if _plain_call(args) and all(args[i] is t and t._version == v for i, t, v in self.frozen):
                try:
                    outs = self.runner._infer([args[i] for i in self.inputs])
                    return tuple(outs[j] for j in self.outputs)
                except Exception as exc:  # noqa: BLE001 - fall through to the full path, for good
                    log(f"model cache: replay failed ({type(exc).__name__}: {exc}); building the graph")
            else:
                log("model cache: this call needs the full path (gradients, autocast or changed weights)")
            self.full = self.aot(self.gm, list(args))
        return self.full(*args)
