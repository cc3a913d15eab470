"""Run a function right after a module has been imported, whoever imports it.

``ember run`` never imports ``torch._dynamo`` or ``torch._inductor`` itself (ember does not use them).
A script, or a library it uses (transformers imports ``torch._dynamo`` submodules), may; when that
import completes, ``AfterImport`` hands the module to ember's translation layer, which puts ember's
functions on it and may give ``sys.modules`` a replacement object (the config proxies).
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Callable

# hook(module) -> a replacement for sys.modules[name], or None to keep the module
Hook = Callable[[object], object]


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, inner, hook: Hook, name: str):
        self.inner, self.hook, self.name = inner, hook, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        spec = module.__spec__
        spec.loader = module.__loader__ = self.inner  # the module keeps its real loader
        self.inner.exec_module(module)
        replacement = self.hook(module)
        if replacement is not None:
            # importlib reads sys.modules again after exec_module: the importer receives this object
            sys.modules[self.name] = replacement


class AfterImport(importlib.abc.MetaPathFinder):
    """A meta path finder that only wraps the loader of the modules named in ``hooks``."""

    def __init__(self, hooks: dict[str, Hook]):
        self.hooks = hooks

    def find_spec(self, fullname, path, target=None):
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, hook, fullname)
        return spec

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
