"""The autograd layer's pipeline: one captured graph in, one callable out.

    analyze (functionalized fake run) -> trace forward, or joint -> partition -> compile -> runtime variant

``AOTCompiledGraph`` is what a backend built by ``aot_autograd`` returns. It compiles the variant for the
autograd situation of the call it was built for and, lazily, another one if a later call differs (grad
mode switched off, a different set of inputs needing gradients), so a call never runs a variant traced
for a different situation.
"""
from __future__ import annotations

import contextlib
import itertools
import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch._subclasses import FakeTensorMode

from ember.aot import analysis, blocks, deferred, mask_simplify
from ember.aot import cache as aot_cache
from ember.aot.runtime import EagerVariant, InferenceVariant, TrainingVariant
from ember.aot.trace import (JointGraph, guess_plain_outputs, trace_forward, trace_forward_analyzed, trace_joint,
                             trace_joint_analyzed)
from ember.config import config
from ember.diagnostics import counters
from ember.diagnostics.userframe import warn_user
from ember.diagnostics import logging as elog
from ember.locks import COMPILE_LOCK

# The dumps go to a named artifact (EMBER_LOGS=aot_graphs), declared in ember.diagnostics.logging.
ARTIFACT = "aot_graphs"

_graph_ids = itertools.count()
_REQUIRES_GRAD = operator.attrgetter("requires_grad")

# ATen ops (overload packets) that a compiled training graph cannot run as traced, and why: a joint
# graph with one of them runs eagerly, logged, instead of crashing at its first backward
EAGER_IN_TRAINING = {
    "aten.mkldnn_rnn_layer": "mkldnn_rnn_layer (an LSTM/GRU on CPU) returns an undefined workspace where its "
                             "meta function gives an empty tensor; its backward op refuses None from Python and "
                             "crashes on an empty tensor, so the saved workspace cannot be handed back",
}


def _eager_in_training(gm: fx.GraphModule) -> str | None:
    for node in gm.graph.nodes:
        if node.op == "call_function":
            packet = str(getattr(node.target, "overloadpacket", ""))
            if packet in EAGER_IN_TRAINING:
                return EAGER_IN_TRAINING[packet]
    return None
_grad_enabled = torch.is_grad_enabled


@dataclass(frozen=True)
class AOTOptions:
    fw_compiler: Callable
    bw_compiler: Callable
    inference_compiler: Callable
    partition_fn: Callable
    decompositions: dict
    strict: bool = False  # raise when a graph cannot be traced, instead of running it eagerly


class AOTCompiledGraph:
    """Callable form of one captured graph; ``compiled(*inputs)`` returns what ``gm(*inputs)`` returns."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list, options: AOTOptions):
        # size-only attention masks (``mask_simplify``) are rewritten before the first trace, not here
        # (``Captured.prepare``): a graph whose traced parts come from the cache never needs them
        self.gm, self.options = gm, options
        self.captured = Captured(gm)
        self.id = next(_graph_ids)
        self.name = f"{type(gm).__name__}#{self.id}"
        self._tidx = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.Tensor)]
        # non-tensor inputs are baked into the traced graphs, so they are part of the variant key
        # (except ints traced as symbols: those are graph inputs)
        symbolic = self._symbolic = analysis.symbolic_templates(gm)  # (read once: a scan of every node)
        symints = {i for i, t in enumerate(symbolic[1]) if analysis.is_symint(t)} if symbolic else set()
        self._cidx = [i for i, a in enumerate(example_inputs) if not isinstance(a, torch.Tensor) and i not in symints]
        # every argument a tensor (the usual graph): the per-call key reads them all, no index list
        self._all_tensors = len(self._tidx) == len(example_inputs)
        self.variants: dict = {}
        self._variant(self._key(example_inputs), list(example_inputs))

    def _key(self, args):
        grads = None
        if torch.is_grad_enabled():
            mask = tuple([args[i].requires_grad for i in self._tidx])
            grads = mask if True in mask else None
        return (grads, tuple(args[i] for i in self._cidx)) if self._cidx else grads

    def __call__(self, *args):
        # ``_key`` inline, in C calls only (no frame, no comprehension): this runs at every call
        if self._cidx:
            key = self._key(args)
        elif _grad_enabled():
            mask = tuple(map(_REQUIRES_GRAD, args if self._all_tensors else map(args.__getitem__, self._tidx)))
            key = mask if True in mask else None
        else:
            key = None
        variant = self.variants.get(key)
        if variant is None:
            with COMPILE_LOCK:  # tracing is not thread-safe (ember/locks.py); another thread may have built it
                variant = self.variants.get(key)
                if variant is None:
                    variant = self._variant(key, list(args))
        return variant(*args)

    def _variant(self, key, args: list):
        try:
            with COMPILE_LOCK:
                variant = build_variant(self.gm, args, self.options, self.name, self._symbolic, self.captured)
        except Exception as exc:  # noqa: BLE001 - any tracing failure: the eager graph is still right
            if self.options.strict:
                raise
            reason = f"tracing it failed with {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            counters.eager_fallback("aot_variant", f"{self.name}: {reason}")
            warn_user(f"ember aot_autograd: running {self.name} eagerly, {reason}")
            self.captured.prepare()
            variant = EagerVariant(self.gm, reason)
            elog.artifact(ARTIFACT, f"# ===== ember aot: {self.name}, eager variant: {reason}")
        self.variants[key] = variant
        return variant

    def describe(self) -> str:
        return "\n\n".join(describe_variant(v, self.name) for v in self.variants.values())


class Captured:
    """The captured graph's one rewrite before it is traced, and the text its cache keys are of.

    ``mask_simplify`` replaces size-only attention masks (an analysis that runs the masks' ops on
    real tensors: 0.1 s of GPT-2 training's warm first call on the H100). Its result is in the
    traced graphs a cache entry holds, so a variant loaded from the cache never needs it: it runs
    at the first trace (or eager variant), once per graph. Every variant's key is of the graph as
    captured (``key_text``, read before the rewrite), so a warm process, which never rewrites, and
    a cold one, which rewrote at its first variant, key each variant alike. Sound: the rewrite is
    a function of what that key holds (the graph's nodes, its constants, the inputs' sizes), and
    of ember's code, which every key holds too."""

    __slots__ = ("gm", "text", "rewritten")

    def __init__(self, gm: fx.GraphModule):
        self.gm, self.text, self.rewritten = gm, None, False

    def key_text(self) -> str:
        if self.text is None:
            self.text = aot_cache.graph_text(self.gm)
        return self.text

    def prepare(self) -> None:
        """Rewrite the graph's masks (once), keeping its captured text for later keys first."""
        if self.rewritten:
            return
        if self.text is None and config.aot_cache:
            try:
                self.key_text()
            except Exception:  # noqa: BLE001 - a graph the key cannot spell: no key is taken of it
                pass
        self.rewritten = True
        mask_simplify.simplify_attention_masks(self.gm)  # (size-only attention masks: dropped or is_causal)


_UNREAD = object()


def build_variant(gm: fx.GraphModule, args: list, opts: AOTOptions, name: str = "graph", symbolic=_UNREAD,
                  captured: Captured | None = None):
    """Analyze, trace, partition and compile ``gm`` for the autograd situation of ``args``; the
    traced graphs come from the on-disk cache (``cache.py``) when an earlier process stored them.
    ``symbolic``: ``analysis.symbolic_templates(gm)``, when the caller has it; ``captured``: the
    caller's ``Captured`` of ``gm`` (one is made otherwise)."""
    if symbolic is _UNREAD:
        symbolic = analysis.symbolic_templates(gm)
    if captured is None:
        captured = Captured(gm)
    key = None
    if symbolic is None:  # (graphs with size symbols are traced every time)
        try:
            key = aot_cache.key_of(gm, args, opts, captured.key_text() if config.aot_cache else None)
        except Exception as e:  # noqa: BLE001 - NotCacheable, or a gap in the key: trace as usual
            aot_cache.STATS["uncacheable"] += 1
            if not isinstance(e, aot_cache.NotCacheable):
                elog.get_logger("graph_breaks").info(f"ember aot cache: no key for {name}: {type(e).__name__}: {e}")
    parts = aot_cache.load(key, FakeTensorMode(allow_non_fake_inputs=True), _GRAPHS) if key is not None else None
    variant = None
    if parts is not None:
        try:
            variant = _compile_parts(parts, gm, args, opts)
        except deferred.StaleCacheEntry as e:  # nodes read for the first time, and not what the key says
            aot_cache.stale(key, e)
            parts = None
    if parts is None or parts["kind"] == "eager":
        captured.prepare()
    if parts is None:
        _before_trace(opts, gm, args)
        parts = _trace_parts(gm, args, opts, name, symbolic)
        if key is not None and parts["kind"] != "eager":
            aot_cache.store(key, parts, _GRAPHS)
        variant = _compile_parts(parts, gm, args, opts)
    variant.meta = parts["meta"]
    if config.verify:  # EMBER_VERIFY=1: check every graph this layer built
        for graph in (getattr(variant, a, None) for a in ("graph", "forward", "backward")):
            if graph is not None:
                graph.graph.lint()
    if elog.enabled(ARTIFACT):
        elog.artifact(ARTIFACT, describe_variant(variant, name))
    return variant


def _before_trace(opts: AOTOptions, gm, args: list) -> None:
    """What the compilers start before this graph is traced: each one's ``ember_before_trace(gm,
    args)``, if it has one (the native backend starts its kernel-build worker processes, which
    then import Triton during the seconds the trace takes instead of after it). A hook that fails
    costs nothing but its head start."""
    hooks = []
    for c in (opts.inference_compiler, opts.fw_compiler, opts.bw_compiler):
        hook = getattr(c, "ember_before_trace", None)
        if hook is not None and hook not in hooks:
            hooks.append(hook)
    for hook in hooks:
        try:
            hook(gm, args)
        except Exception as e:  # noqa: BLE001 - a head start, never a reason not to compile
            elog.get_logger("graph_breaks").info(f"ember aot: {hook!r} before tracing failed: {type(e).__name__}: {e}")


def _trace_parts(gm, args, opts, name, symbolic) -> dict:
    """Analysis and tracing: {kind, meta, and the traced graphs} (graphs not compiled yet)."""
    if symbolic is not None:  # dynamic shapes: trace in the frontend's ShapeEnv, with its symbols
        fake_mode, templates = symbolic
        fake_mode.allow_non_fake_inputs = True
    else:
        fake_mode, templates = FakeTensorMode(allow_non_fake_inputs=True), None
    if not (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
        # no input needs a gradient: analysis and the forward trace in one run (None: the graph needs
        # the analysis first, e.g. it must run eagerly or an output needs a gradient)
        analyzed = _with_blocks(trace_forward_analyzed, gm, args, fake_mode, opts, templates, joint=False)
        if analyzed is not None:
            meta, graph = analyzed
            return dict(kind="inference", meta=meta, graph=graph)
    joint = None
    guess = guess_plain_outputs(gm, args) if templates is None and config.aot_joint_analyzed else None
    if guess is not None:  # the usual training graph: analysis and joint trace in one run
        analyzed = _with_blocks(trace_joint_analyzed, gm, args, fake_mode, opts, guess, joint=True)
        if analyzed is not None:
            meta, joint = analyzed
    if joint is None:
        meta = analysis.collect(gm, args, fake_mode, templates)
    wants_grads = torch.is_grad_enabled() and any(args[i].requires_grad for i in meta.tensor_indices)
    needs_autograd = any(meta.traced_requires_grad)
    if meta.unsupported is None and needs_autograd and not wants_grads:
        meta.unsupported = "an output needs a gradient though the call does not (enable_grad inside no_grad)"
    if meta.unsupported is not None:
        return dict(kind="eager", meta=meta)
    if needs_autograd:
        if joint is None:
            joint = trace_joint(gm, meta, args, fake_mode, opts.decompositions, templates)
        if elog.enabled(ARTIFACT):
            elog.artifact(ARTIFACT, _banner(name, "joint graph", meta) + _readable(joint.gm))
        why = _eager_in_training(joint.gm)
        if why is not None:
            meta.unsupported = why
            counters.eager_fallback("aot_variant", f"{name}: {why}")
            return dict(kind="eager", meta=meta)
        fw, bw = opts.partition_fn(joint.gm, joint.primal_vals, num_fwd_outputs=joint.num_fw_outputs)
        return dict(kind="training", meta=meta, fw=fw, bw=bw, num_fw_outputs=joint.num_fw_outputs,
                    grad_inputs=joint.grad_inputs)
    graph = trace_forward(gm, meta, args, fake_mode, opts.decompositions, templates)
    return dict(kind="inference", meta=meta, graph=graph)


def _with_blocks(trace_fn, gm, args, fake_mode, opts, extra, joint: bool):
    """``trace_fn(gm, args, fake_mode, decompositions, extra)``, each distinct repeated block traced
    once (``blocks.py``) where the graph has such blocks and no size symbols; traced as before when
    that trace fails or finds what only the analysis-first path handles."""
    run = blocks.plan(gm, args, fake_mode, opts.decompositions, joint) if extra is None or joint else None
    if run is not None:
        try:
            got = trace_fn(gm, args, fake_mode, opts.decompositions, extra, runner=run.runner)
        except Exception as e:  # noqa: BLE001 - traced again without the blocks, which reports what it meets
            elog.get_logger("graph_breaks").info(f"ember aot blocks: whole trace failed, tracing every block: "
                                                 f"{type(e).__name__}: {e}")
            got = None
        finally:
            run.close()
        if got is not None:
            return got
        blocks.STATS["retraced"] += 1
    return trace_fn(gm, args, fake_mode, opts.decompositions, extra)


_GRAPHS = ("graph", "fw", "bw")  # the entries of a traced-parts dict that are graph modules


def _compile_parts(parts: dict, gm, args: list, opts: AOTOptions):
    meta = parts["meta"]
    if parts["kind"] == "eager":
        return EagerVariant(gm, meta.unsupported, meta)
    inputs = [args[i] for i in meta.graph_inputs]
    if parts["kind"] == "inference":
        graph = parts["graph"]
        return InferenceVariant(meta, graph, opts.inference_compiler(graph, inputs) or graph.forward)
    fw, bw = parts["fw"], parts["bw"]
    joint = JointGraph(None, parts["num_fw_outputs"], parts["grad_inputs"], None)
    compiled_fw = opts.fw_compiler(fw, inputs) or fw.forward
    bw_examples = deferred.placeholder_vals(bw)  # (a cached graph's, without building its nodes)
    bw_examples = _saved_as_produced(compiled_fw, parts["num_fw_outputs"], bw_examples)
    compiled_bw = opts.bw_compiler(bw, bw_examples) or bw.forward
    return TrainingVariant(meta, joint, fw, bw, compiled_fw, compiled_bw)


def _saved_as_produced(compiled_fw, num_fw_outputs: int, bw_examples: list) -> list:
    """The backward's example inputs, with each saved tensor laid out as the compiled forward really
    returns it. The traced values carry eager's strides; a code generator may return others (the
    native backend pads a matmul's rows for cuBLAS), and a backward compiled for eager's would meet
    inputs it does not expect at every call. The forward's compiler reports its outputs' strides in
    ``ember_native["output_strides"]`` (native backend); other compilers leave the examples as traced."""
    strides = (getattr(compiled_fw, "ember_native", None) or {}).get("output_strides")
    if not strides:
        return bw_examples
    out = list(bw_examples)
    for i, st in enumerate(strides[num_fw_outputs:]):
        ex = out[i] if i < len(out) else None
        if st is None or not isinstance(ex, torch.Tensor) or len(st) != ex.dim() or list(ex.stride()) == st:
            continue
        mode = getattr(ex, "fake_mode", None)
        with mode if mode is not None else contextlib.nullcontext():
            out[i] = torch.empty_strided(ex.shape, st, dtype=ex.dtype, device=ex.device)
    return out


# ------------------------------------------------------------------------------------------- dumps

def _readable(gm: fx.GraphModule) -> str:
    return gm.print_readable(print_output=False, include_stride=False, include_device=False)


def _comment(text: str) -> str:
    return "\n".join(f"# {line}" if line else "#" for line in text.splitlines())


def _banner(name: str, what: str, meta) -> str:
    return f"# ===== ember aot: {name}, {what}\n{_comment(meta.describe())}\n"


def describe_variant(variant, name: str = "graph") -> str:
    """Readable dump of one variant: how inputs/outputs are handled, then its graphs; training variants
    lead with the partition summary (what the forward saves for the backward, what is recomputed)."""
    meta = variant.meta
    if variant.kind == "eager":
        head = _banner(name, "eager variant", meta) if meta is not None else f"# ===== ember aot: {name}\n"
        return head + _comment(variant.describe())
    if variant.kind == "inference":
        return _banner(name, "inference variant (no autograd)", meta) + _readable(variant.graph)
    summary = variant.forward.meta.get("ember_partition")
    parts = [_banner(name, "training variant", meta)]
    if summary is not None:
        parts.append(_comment(summary.render()) + "\n")
    parts += ["# ----- forward", _readable(variant.forward), "# ----- backward", _readable(variant.backward)]
    return "\n".join(parts)
