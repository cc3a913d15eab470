"""Compile-time paths of the frontend (issue 29): no full collection of the cyclic garbage collector
runs while a frame compiles (its third threshold is raised, then restored), and constant guards
render their literals without ``eval`` where the repr is known to read back."""
import gc
import math

import torch

import ember
from ember.frontend import convert
from ember.frontend.guards import _roundtrips


def test_no_full_collection_during_a_compile_and_thresholds_restored():
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.get_threshold())
        return gm.forward

    before = gc.get_threshold()
    f = ember.compile(lambda x: torch.cos(x) * 3, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.cos(x) * 3)
    assert seen and seen[0][:2] == before[:2] and seen[0][2] == convert._NO_FULL_COLLECTIONS
    assert gc.get_threshold() == before


def test_thresholds_the_program_sets_during_a_compile_are_kept():
    before = gc.get_threshold()

    def backend(gm, example_inputs):
        gc.set_threshold(500, 5, 5)  # (a program changing its collector while compiling)
        return gm.forward
    try:
        ember.compile(lambda x: x + 1, backend=backend)(torch.randn(3))
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_a_disabled_collector_is_left_alone():
    before = gc.get_threshold()
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.get_threshold())
        return gm.forward
    gc.disable()
    try:
        ember.compile(lambda x: x * 2, backend=backend)(torch.randn(3))
    finally:
        gc.enable()
    assert seen == [before] and gc.get_threshold() == before


def test_roundtrips_without_eval():
    for v in (0, -7, 2**70, "a'b\"c\n", b"\x00z", 1.5, -0.0, 1e300, 5e-324):
        assert _roundtrips(v) and eval(repr(v)) == v  # noqa: S307
    for v in (math.inf, -math.inf):
        assert not _roundtrips(v)
    assert not _roundtrips(object())
    import enum

    class Color(enum.IntEnum):
        RED = 1
    assert not _roundtrips(Color.RED)  # an int subclass: its repr (<Color.RED: 1>) does not read back


def test_objects_from_before_are_frozen_during_the_compile_only():
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.get_freeze_count())
        return gm.forward
    assert gc.get_freeze_count() == 0
    ember.compile(lambda x: torch.sin(x) + 1, backend=backend)(torch.randn(3))
    assert seen and seen[0] > 0  # the process's objects sat in the permanent generation
    assert gc.get_freeze_count() == 0  # ... and none stays there


def test_a_program_that_froze_objects_keeps_them_frozen(monkeypatch):
    calls = []
    freeze, unfreeze = gc.freeze, gc.unfreeze
    gc.freeze()
    try:
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        ember.compile(lambda x: torch.sin(x) * 5, backend=lambda gm, ex: gm.forward)(torch.randn(3))
        assert calls == [] and gc.get_freeze_count() > 0  # (neither frozen again nor thawed)
    finally:
        monkeypatch.undo()
        unfreeze()
    assert gc.freeze is freeze


def test_freeze_off_by_config():
    from ember.config import config
    seen = []

    def backend(gm, example_inputs):
        seen.append((gc.get_freeze_count(), gc.get_threshold()[2]))
        return gm.forward
    old, config.compile_gc_freeze = config.compile_gc_freeze, False
    try:
        ember.compile(lambda x: torch.sin(x) - 2, backend=backend)(torch.randn(3))
    finally:
        config.compile_gc_freeze = old
    assert seen == [(0, convert._NO_FULL_COLLECTIONS)]


def test_compile_garbage_is_collected_at_the_end():
    import weakref

    class Junk:
        pass
    refs = []

    def backend(gm, example_inputs):
        a, b = Junk(), Junk()
        a.other, b.other = b, a  # a cycle only the collector frees
        refs.append(weakref.ref(a))
        for _ in range(3):  # (promoted out of the young generations)
            gc.collect(1)
        return gm.forward
    ember.compile(lambda x: torch.cos(x) - 4, backend=backend)(torch.randn(3))
    assert refs and refs[0]() is None
