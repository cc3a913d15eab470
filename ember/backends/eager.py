"""The ``eager`` backend: run the captured FX graph as Python. ``ember`` is the default backend name;
until the native Triton backend lands it runs graphs eagerly too."""
from __future__ import annotations

from ember.backends.registry import register_backend


@register_backend(name="eager")
def eager(gm, example_inputs):
    return gm.forward


@register_backend(name="ember")
def ember_default(gm, example_inputs):
    return gm.forward
