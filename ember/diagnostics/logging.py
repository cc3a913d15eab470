"""Named log artifacts (``EMBER_LOGS=graph_breaks,recompiles,...``).

Each artifact is a logger ``ember.<name>``; an artifact named in EMBER_LOGS (or ``ember.config.logs``)
is printed to stderr as it happens.
"""
from __future__ import annotations

import logging
import sys

from ember.config import config

ARTIFACTS = {
    "graph_breaks": "each graph break or whole-frame fallback, with its reason and user file:line",
    "recompiles": "each cache miss that recompiles, naming the first failing guard",
    "guards": "the generated guard code of each new cache entry",
    "graph_code": "the captured FX graph of each compile",
    "output_code": "generated code: each entry function (guards, input loads, graph call, output rebuild), each "
                   "graph-break function, and the native backend's wrapper and Triton kernels",
    "aot_graphs": "the ATen graphs of the autograd layer: forward/backward (with what the partitioner saved or "
                  "recomputed, and why), inference, input/output handling",
    "openvino": "the openvino backends: partitions, ops kept in PyTorch and why, conversion, cache, fallbacks",
    "bytecode": "every bytecode instruction as the symbolic interpreter runs it (very verbose)",
}

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("[ember %(name)s] %(message)s"))


def _enabled_set() -> set[str]:
    names = {n.strip() for n in config.logs.split(",") if n.strip()}
    if "all" in names:
        names = set(ARTIFACTS)
    unknown = names - set(ARTIFACTS)
    if unknown:
        raise ValueError(f"unknown EMBER_LOGS artifact(s) {sorted(unknown)}; valid: {sorted(ARTIFACTS)} or 'all'")
    return names


def get_logger(name: str) -> logging.Logger:
    assert name in ARTIFACTS, name
    log = logging.getLogger(f"ember.{name}")
    if not getattr(log, "_ember_configured", False):
        log._ember_configured = True
        log.propagate = True
        log.addHandler(_handler)
        log.setLevel(logging.DEBUG if name in _enabled_set() else logging.WARNING)
    return log


def enabled(name: str) -> bool:
    return get_logger(name).isEnabledFor(logging.DEBUG)


def artifact(name: str, text: str) -> None:
    log = get_logger(name)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(text)


def refresh() -> None:
    """Re-read ``config.logs`` (after a test or a user changed it)."""
    names = _enabled_set()
    for art in ARTIFACTS:
        logging.getLogger(f"ember.{art}").setLevel(logging.DEBUG if art in names else logging.WARNING)
