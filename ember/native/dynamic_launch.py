"""Launch sites whose grid depends on the call's sizes (graphs with symbolic sizes).

A kernel with symbolic sizes takes them as arguments that Triton does not specialize on
(``do_not_specialize``), so one binary serves every size; only the number of programs changes from
call to call. ``DynamicLaunch`` keeps one ``runtime.Launch`` per grid it has seen: each gets Triton's
per-call work done once (at its first call, which finds the binary already compiled), and a call
costs one dict lookup more than a static launch site.
"""
from __future__ import annotations

from ember.native.runtime import Launch


class DynamicLaunch:
    """``launch(programs, *args)`` runs ``fn[(programs,)](*args, **meta)``."""
    __slots__ = ("fn", "meta", "fresh", "sites")

    def __init__(self, fn, meta: dict, fresh=()):
        self.fn, self.meta, self.fresh = fn, meta, fresh
        self.sites: dict[int, Launch] = {}

    def __call__(self, programs: int, *args):
        site = self.sites.get(programs)
        if site is None:
            site = self.sites[programs] = Launch(self.fn, (programs,), self.meta, fresh=self.fresh)
        return site(*args)
