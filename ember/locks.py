"""The locks that make compiling and calling from several threads safe.

Tracing touches process-global state that is not ours to make thread-safe: torch.fx's patcher
(``torch.fx._symbolic_trace`` keeps the active patcher in a module global, so two ``make_fx`` calls at
once fail with "CURRENT_PATCHER is None"), the dispatch-mode stack that FakeTensorMode and
proxy tracing push onto, Triton's interpreter (it patches ``triton.language`` while a kernel runs),
plus ember's own tables filled while compiling (trace rules, caches of generated code). So every
compile anywhere in ember runs under one process-wide re-entrant lock, ``COMPILE_LOCK``:

* ``FrameCache`` takes it around tracing a frame and calling its backend (after taking the frame's
  own lock, so one thread compiles a frame and the others wait for that entry instead of compiling
  it again);
* work a compiled graph defers to its first call with new inputs (an autograd variant, a per-size
  native compile, a kernel's first launch) takes it too, and looks again once it holds it.

Order: a frame's lock, then ``COMPILE_LOCK``; never the other way round (the compile itself never
calls a compiled frame). Re-entrant, because a backend may run code that compiles lazily.
Cache hits take no lock: entry lists are replaced whole (copy-on-write), never mutated in place.
"""
from __future__ import annotations

import threading

COMPILE_LOCK = threading.RLock()
