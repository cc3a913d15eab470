"""The built-in backends: ``eager`` runs the captured FX graph as Python; ``ember`` (alias ``inductor``,
so code written for torch.compile runs unchanged) is the default. Until the native Triton backend
lands, ``ember`` runs graphs eagerly too."""
from __future__ import annotations

import warnings

from ember.backends.registry import register_alias, register_backend

_MODES_NOT_YET = {"reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}
_warned_modes: set = set()


@register_backend(name="eager", tags=("debug",), options={})
def eager(gm, example_inputs):
    return gm.forward


@register_backend(name="ember", options={})
def ember_default(gm, example_inputs, mode=None, options=None):
    if mode in _MODES_NOT_YET and mode not in _warned_modes:
        # correct results, just not the mode's speedup: say so once instead of pretending
        _warned_modes.add(mode)
        warnings.warn(f"ember: mode={mode!r} is accepted but not implemented yet by the 'ember' backend; "
                      "graphs run with the default settings", stacklevel=2)
    return gm.forward


register_alias("inductor", "ember")
