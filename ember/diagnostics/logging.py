"""Named log artifacts (``EMBER_LOGS=graph_breaks,recompiles,...``).

Each artifact is a logger ``ember.<name>``; an artifact named in EMBER_LOGS (or ``ember.config.logs``)
is printed to stderr as it happens.
"""
from __future__ import annotations

import logging
import sys

from ember.config import config
from ember.diagnostics.artifacts import ARTIFACTS  # the names live apart: ember.config checks them

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("[ember %(name)s] %(message)s"))


def _enabled_set() -> set[str]:
    names = {n.strip() for n in config.logs.split(",") if n.strip()}
    if "all" in names:
        names = set(ARTIFACTS)
    return names & set(ARTIFACTS)  # ember.config rejected unknown names when they were set


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


# ---- one-time notices ----------------------------------------------------------------------------
# A setting ember accepts but cannot honour (a torch._dynamo.config knob, an inductor option without an
# ember meaning) is said once per process on stderr, never as an error and never per call.
_notice = logging.getLogger("ember.notice")
_notice_handler = logging.StreamHandler(sys.stderr)
_notice_handler.setFormatter(logging.Formatter("[ember] %(message)s"))
_notice.addHandler(_notice_handler)
_notice.setLevel(logging.INFO)
_notice.propagate = False
_noticed: set = set()


def notice_once(key, text: str) -> None:
    """Print ``text`` on stderr the first time ``key`` is noticed in this process."""
    if key in _noticed:
        return
    _noticed.add(key)
    _notice.info(text)
