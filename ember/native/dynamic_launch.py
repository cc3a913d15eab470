"""Launch sites whose grid depends on the call's sizes (graphs with symbolic sizes).

A kernel with symbolic sizes takes them as arguments that Triton does not specialize on
(``do_not_specialize``), so one binary serves every size; only the number of programs changes from
call to call. ``DynamicLaunch`` keeps one ``runtime.Launch`` per grid it has seen: each gets Triton's
per-call work done once (at its first call, which finds the binary already compiled), and a call
costs one dict lookup more than a static launch site. Once one grid's site has its compiled kernel,
a new grid's site adopts that kernel (``Launch.adopt``: the sizes are not specialized on, so the
binary is the same) instead of going through Triton's JIT again; an AOT package sets ``template``
from its stored binary before the first call.
"""
from __future__ import annotations

from ember.native.runtime import Launch


class DynamicLaunch:
    """``launch(programs, *args)`` runs ``fn[(programs,)](*args, **meta)``."""
    __slots__ = ("fn", "meta", "fresh", "sites", "template")

    def __init__(self, fn, meta: dict, fresh=()):
        self.fn, self.meta, self.fresh = fn, meta, fresh
        self.sites: dict[int, Launch] = {}
        self.template = None  # (CompiledKernel, alignment checks, number of arguments), once known

    def __call__(self, programs: int, *args):
        site = self.sites.get(programs)
        if site is None:
            site = self.sites[programs] = Launch(self.fn, (programs,), self.meta, fresh=self.fresh)
            if self.template is None:
                known = next((s for s in self.sites.values() if s.kernel is not None and s.fast is not None), None)
                if known is not None:
                    self.template = (known.kernel, known.checks, len(args))
            if self.template is not None:
                site.adopt(*self.template)
        return site.run(*args)
