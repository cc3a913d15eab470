"""torch.compile's inductor options (``options={"max_autotune": True, ...}``), as the ``ember`` backend
(alias ``inductor``) reads them, so code written for torch.compile passes them unchanged.

Three kinds of name:

- a name in ``MEANINGS`` sets what ember has for it (a mode switch or a ``NativeOptions`` field);
- any other inductor option name of torch (``inductor_names.txt``, every key of
  ``torch._inductor.config`` of the torch release ember tracks; ``tools/gen_inductor_names.py``
  regenerates it) is accepted, with one notice per name and process that it has no effect in ember;
- a name torch does not know either is a typo: ``ember.compile`` raises, naming the closest option.
  Under ``ember run`` (``accept_unknown``), it is accepted with a notice instead, since the script
  may target a newer torch whose names this table has not seen; torch.compile itself would check it.

The values are checked as torch checks a boolean option: a mapped switch takes True or False.
"""
from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from ember.diagnostics.logging import notice_once


@dataclasses.dataclass(frozen=True)
class Meaning:
    setting: str        # "cudagraphs", "autotune" (what a mode switches) or a NativeOptions field
    invert: bool        # the ember setting is the negation of the option (force_disable_caches)
    doc: str


# inductor option -> what it sets in ember (docs/dropin.md shows this table)
MEANINGS = {
    "max_autotune": Meaning("autotune", False, "tune kernel launch configs and matmuls on the device (CUDA)"),
    "max_autotune_pointwise": Meaning("autotune", False, "as max_autotune (ember tunes all kernels together)"),
    "max_autotune_gemm": Meaning("autotune", False, "as max_autotune (ember tunes all kernels together)"),
    "coordinate_descent_tuning": Meaning("autotune", False, "as max_autotune: ember's tuner searches block sizes"),
    "triton.cudagraphs": Meaning("cudagraphs", False, "replay each compiled graph as a CUDA graph (CUDA)"),
    "shape_padding": Meaning("pad_mm", False, "pad matmuls with misaligned sizes (NativeOptions.pad_mm)"),
    "fx_graph_cache": Meaning("cache", False, "the on-disk graph cache (NativeOptions.cache)"),
    "force_disable_caches": Meaning("cache", True, "True turns the on-disk graph cache off"),
    "emulate_precision_casts": Meaning("emulate_precision_casts", False,
                                       "round fp16/bf16 casts inside fused kernels as eager does"),
}

# options whose effect ember always has (or never needs): no notice that they are "ignored"
ALREADY = {
    "epilogue_fusion": "ember fuses pointwise epilogues whenever it can",
    "aggressive_fusion": "ember fuses whatever its scheduler can",
    "freezing": "parameters are read at each call; results are the same",
}

_NAMES_FILE = Path(__file__).with_name("inductor_names.txt")
_names: frozenset | None = None

# set by `ember run` for the duration of a script: an unknown name is a notice, not an error
accept_unknown = False
# torch._inductor.config settings a script made under `ember run` (dropin/session.py): the defaults
# under each compile's own options
GLOBAL: dict = {}


def inductor_names() -> frozenset:
    """Every inductor option name of the tracked torch release."""
    global _names
    if _names is None:
        lines = _NAMES_FILE.read_text().splitlines()
        _names = frozenset(ln.strip() for ln in lines if ln.strip() and not ln.startswith("#"))
    return _names


class InductorOptionTable:
    """The ``options`` declaration of the ``ember`` backend (``registry.validate_options`` calls
    ``validate``)."""

    def validate(self, options: dict) -> dict:
        known = inductor_names() | set(MEANINGS)
        out = {}
        for key, value in options.items():
            if key in MEANINGS:
                if type(value) is not bool:
                    raise TypeError(f"option {key!r} of backend 'ember' must be True or False, got "
                                    f"{type(value).__name__} {value!r} ({key}: {MEANINGS[key].doc})")
                out[key] = value
            elif key in known:
                why = ALREADY.get(key, "it has no ember equivalent; ignored")
                notice_once(("inductor", key), f"inductor option {key}={value!r} accepted: {why} (docs/dropin.md)")
                out[key] = value
            elif accept_unknown:
                notice_once(("inductor", key), f"option {key}={value!r} is not an inductor option of the torch "
                                               "release ember tracks; ignored")
                out[key] = value
            else:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"unknown option {key!r} for backend 'ember'{hint}: it is not an inductor option either. "
                    f"Options with an effect in ember: {', '.join(MEANINGS)}; the other torch.compile inductor "
                    "option names are accepted and ignored (docs/dropin.md), as is 'guard_filter_fn'")
        return out


TABLE = InductorOptionTable()


@dataclasses.dataclass
class Translation:
    cudagraphs: bool | None = None   # None: as the mode says
    autotune: bool | None = None
    native: dict = dataclasses.field(default_factory=dict)  # NativeOptions overrides


def translate(options: dict | None) -> Translation:
    """What the (validated) options change in ember; the names without a meaning change nothing."""
    t = Translation()
    for key, value in {**GLOBAL, **(options or {})}.items():
        m = MEANINGS.get(key)
        if m is None:
            continue
        value = (not value) if m.invert else value
        if m.setting == "cudagraphs":
            t.cudagraphs = value
        elif m.setting == "autotune":
            t.autotune = bool(t.autotune) or value
        else:
            t.native[m.setting] = value
    return t


def markdown_table() -> str:
    """The table of docs/dropin.md (a test keeps the two identical)."""
    rows = ["| Inductor option | Sets in ember | Meaning |", "|---|---|---|"]
    for key, m in MEANINGS.items():
        rows.append(f"| `{key}` | `{'not ' if m.invert else ''}{m.setting}` | {m.doc} |")
    for key, why in ALREADY.items():
        rows.append(f"| `{key}` | (nothing) | {why} |")
    return "\n".join(rows) + "\n"
