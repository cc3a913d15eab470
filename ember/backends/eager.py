"""The ``eager`` debug backend: runs the captured FX graph as Python, nothing compiled.

Useful to tell a frontend problem (capture, guards, graph breaks) from a backend one. The default
backend lives in ``ember_backend.py``.
"""
from __future__ import annotations

from ember.backends.registry import register_backend


@register_backend(name="eager", tags=("debug",), options={})
def eager(gm, example_inputs):
    return gm.forward
