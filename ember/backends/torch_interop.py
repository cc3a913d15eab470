"""ember's backends offered to plain PyTorch: its compiler accepts ``backend="ember"`` once ember is installed.

pyproject.toml lists this module under the ``torch_dynamo_backends`` entry-point group, which
torch.compile scans for backend names it does not know. torch's own frontend (Dynamo) then captures
the graph and hands it here; ember's registry does the rest. Only the registry is imported, so this
adds nothing to torch's import time until the backend is used.
"""
from __future__ import annotations


def ember(gm, example_inputs, **kwargs):
    """The ``ember`` backend, resolved at call time so it always is the current default backend."""
    from ember.backends.registry import backend_spec

    spec = backend_spec("ember")
    return spec.fn(gm, example_inputs, **kwargs)
