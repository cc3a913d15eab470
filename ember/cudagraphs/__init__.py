"""CUDA graphs for compiled graphs (``mode="reduce-overhead"``, the ``cudagraphs`` backend).

A compiled graph still pays Python and launch costs on every call: the wrapper's code, one launch per
kernel. Captured into a CUDA graph, the whole graph becomes one launch. The price is fixed memory:
a replay reads its inputs from, and writes its outputs to, the addresses it was captured with.

    compiler = wrap_compiler(compile_aten_graph)     # fn(gm, example_inputs) -> Runner (or fn, if skipped)

- ``analysis``: what rules a graph out (CPU tensors, symbolic sizes, host synchronization) and which
  inputs it writes in place;
- ``pool``: the memory pool all graphs of a device share, and which of its outputs are still held;
- ``recording``: one captured graph: placeholders for copied inputs, static inputs read in place,
  outputs returned as aliases of the pool or as copies;
- ``runner``: warm-up, recording per input signature, the checks before each replay, re-recording
  up to a limit, and falling back to the plain compiled function.
- ``auto``, ``measure``: default mode's choice of which graphs replay (an estimate, and for inference
  graphs it calls device-bound, a measurement of their first calls); ``stored``: a measured decision
  kept with the graph's cache entry, which a warm process reuses.

``stats()`` counts warm-ups, recordings, replays and fallbacks, and lists why graphs were skipped
or runners disabled; reasons are also logged on the ``ember.cudagraphs`` logger.
"""
from __future__ import annotations

import copy
import itertools
import logging

from ember.cudagraphs import analysis
from ember.cudagraphs.pool import TorchCuda, reset_pools
from ember.cudagraphs.runner import MAX_RECORDINGS, STATS, Runner

__all__ = ["cudagraphify", "wrap_compiler", "stats", "reset", "Runner"]

log = logging.getLogger("ember.cudagraphs")
try:  # EMBER_LOGS=cudagraphs prints this logger's lines (every module here logs to it)
    from ember.diagnostics import logging as _elog
    _elog.get_logger("cudagraphs")
except Exception:  # noqa: BLE001 - logging is informative only
    pass
_ids = itertools.count()


def cudagraphify(fn, gm=None, example_inputs=(), *, name: str | None = None, api=None,
                 max_recordings: int = MAX_RECORDINGS, facts: dict | None = None):
    """``fn`` (compiled from ``gm``) replayed through CUDA graphs, or ``fn`` itself when the graph
    cannot be captured (the reason is logged and counted in ``stats()['skipped']``). ``facts``: what
    is read of ``gm``'s nodes, known already (``auto.graph_facts``: a cached graph's, whose nodes a warm
    start does not build); ``gm`` is then not read."""
    api = api or TorchCuda()
    name = name or f"{type(gm).__name__ if gm is not None else 'graph'}#{next(_ids)}"
    if facts is not None:
        reason = analysis.skip_reason(None, list(example_inputs), api, facts=facts["capture"])
        mutated = facts["mutated"]
    else:
        reason = analysis.skip_reason(gm, list(example_inputs), api)
        mutated = None
    if reason is not None:
        STATS["skipped"].append(f"{name}: {reason}")
        log.info("ember cudagraphs: %s runs without CUDA graphs: %s", name, reason)
        return fn
    if mutated is None:
        mutated = analysis.mutated_inputs(gm)
    return Runner(fn, name=name, api=api, mutated=mutated, max_recordings=max_recordings)


def wrap_compiler(compiler, *, api=None, max_recordings: int = MAX_RECORDINGS):
    """A graph compiler whose results replay through CUDA graphs (fit for ``aot_autograd``'s forward,
    backward and inference compilers: every graph of one device shares one memory pool)."""
    def compile_with_cudagraphs(gm, example_inputs):
        fn = compiler(gm, example_inputs)
        if fn is None:
            fn = gm.forward
        return cudagraphify(fn, gm, example_inputs, api=api, max_recordings=max_recordings)

    compile_with_cudagraphs.__name__ = f"cudagraphs({getattr(compiler, '__name__', 'compiler')})"
    return compile_with_cudagraphs


def stats() -> dict:
    return copy.deepcopy(STATS)


def reset() -> None:
    """Forget the pools and counters (graphs already built keep their own references)."""
    reset_pools()
    for k, v in STATS.items():
        STATS[k] = [] if isinstance(v, list) else 0
