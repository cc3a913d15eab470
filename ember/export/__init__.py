"""``ember.export``: capture a whole model once and deploy it without the compiler (mirrors ``torch.export``).

    ep = ember.export.export(model, (x,), dynamic_shapes={"x": {0: ember.export.Dim("batch")}})
    ember.export.save(ep, "model.pt2")            # torch.export's file format
    ember.export.aot_compile(ep, "model.ember")   # one file: wrapper, kernels, weights
    run = ember.export.aot_load("model.ember")    # no tracing, no FX, no compiling at load time

``export`` returns a genuine ``torch.export.ExportedProgram`` built from ember's own capture (the
frontend and the autograd layer); it never calls ``torch.export.export``. Names load lazily:
``from ember.export import aot_load`` imports only the small runtime module, not the frontend.
"""
from __future__ import annotations

import importlib

# name -> (module, attribute): resolved on first use, so the AOT runtime stays light to import
_LAZY = {
    "export": ("ember.export.api", "export"),
    "save": ("ember.export.api", "save"),
    "load": ("ember.export.api", "load"),
    "Dim": ("ember.export.api", "Dim"),
    "ExportedProgram": ("ember.export.api", "ExportedProgram"),
    "ExportError": ("ember.export.capture", "ExportError"),
    "aot_compile": ("ember.export.package", "aot_compile"),
    "aot_load": ("ember.export.aot_runtime", "aot_load"),
    "PackageMismatch": ("ember.export.aot_runtime", "PackageMismatch"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ember.export' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
