"""A kernel no build worker built is compiled in this process with its launcher's C module compiled
beside it (runtime.Launch._build_here): the hook is set only around the build and then removed,
the launcher's thread is joined before the first launch, and a hook someone else set is left alone."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("triton")
from triton import knobs  # noqa: E402

from ember.native import build_worker, runtime  # noqa: E402


class _Fn:
    """A JITFunction stand-in: ``warmup`` calls the cache hook as Triton's build does."""

    def __init__(self):
        self.events = []

    def warmup(self, *args, grid, **meta):
        hook = knobs.runtime.jit_cache_hook
        self.events.append(("warmup", args, grid, meta, hook is not None))
        if hook is not None:
            assert hook(fn=self, compile={"signature": {}, "constants": {}}) is False  # (build on)

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.events.append(("run", args))
            return "kernel"
        return run


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.setattr(type(runtime.environment), "triton_interpret", property(lambda self: False))
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)


def test_the_launcher_builds_beside_the_kernel_and_is_joined_before_the_launch(no_interpreter, monkeypatch):
    done = []

    def ahead(early):
        def hook(*, fn, compile, **_):
            t = threading.Thread(target=lambda: done.append("launcher"))
            early[:] = [t]
            t.start()
            return False
        return hook
    monkeypatch.setattr(build_worker, "_launcher_ahead", ahead)
    fn = _Fn()
    site = runtime.Launch(fn, (4,), {"BLOCK": 8})
    before = runtime.STATS["built_here"]
    site._build_here((1, 2))
    assert fn.events == [("warmup", (1, 2), (4, 1, 1), {"BLOCK": 8}, True)]
    assert done == ["launcher"] and knobs.runtime.jit_cache_hook is None
    assert runtime.STATS["built_here"] == before + 1


def test_someone_elses_hook_is_left_alone(no_interpreter, monkeypatch):
    mine = lambda **kw: False  # noqa: E731
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", mine)
    fn = _Fn()
    runtime.Launch(fn, (4,), {})._build_here((1,))
    assert fn.events == [] and knobs.runtime.jit_cache_hook is mine


def test_a_failing_build_leaves_the_first_launch_to_build(no_interpreter):
    class Failing(_Fn):
        def warmup(self, *args, grid, **meta):
            raise RuntimeError("no driver")
    runtime.Launch(Failing(), (4,), {})._build_here((1,))
    assert knobs.runtime.jit_cache_hook is None


def test_under_the_interpreter_nothing_is_built_ahead(monkeypatch):
    monkeypatch.setattr(type(runtime.environment), "triton_interpret", property(lambda self: True))
    fn = _Fn()
    runtime.Launch(fn, (4,), {})._build_here((1,))
    assert fn.events == []
