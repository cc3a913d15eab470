"""The first call of a compiled native graph checks what its extern calls return.

Why. The native backend plans every buffer from FakeTensor metadata: an extern call (an ATen op
without a lowering: matmul, convolution, attention, a custom op) is trusted to return what its
fake/meta function said. When it does not, the generated kernels read the buffer with the wrong
element type or shape, silently: bf16 ``_batch_norm_with_update`` on CPU returned bf16 running
statistics where its meta function said float32, and the running mean became ~1e22. Inductor
guards against this with ``assert_size_stride`` after every extern kernel, on every call, and
raises. Here the check runs on the first call only, and a mismatch gives eager's result instead of
an error:

* **Where.** ``wrapper.py`` generates each graph's ``call`` twice: the steady-state body, and a
  first-call body that is the same code plus, right after each extern call whose result the
  compiled code depends on, ``if check.differs(site, result, expected...): return check.aten()``.
  The check runs before any consumer of the result runs, so nothing downstream has read it yet.
* **Why the first call is enough.** An extern op's result metadata is a function of its arguments'
  metadata (sizes, strides, dtype, device: what the wrapper's input guards pin) and of the op's
  implementation in this process (a torch build, a device, a library choice). All of these are
  fixed after the first call; a warm process (cache hit, ``warm_launch`` adopting recorded
  launches) calls ``make_call`` anew, so its first call is checked again: it may run another
  torch build whose kernels return other metadata. The limit: a graph with symbolic sizes is
  checked at the first call of each new set of size-symbol values (a fake function may be right at
  some sizes and wrong at others, a hard-coded dim): its steady-state code tests the tuple of them
  against the set of those that passed (a tuple and a set lookup per call, only in such graphs) and
  calls ``recheck`` for new ones.
* **Steady state pays nothing.** ``arm`` makes the function ``make_call`` returns run the first-call
  code (its ``__code__`` is swapped: both bodies close over the same variables, an assertion here
  checks it); once every check passed, ``passed`` puts the steady-state code back. Callers keep the
  same function object, and later calls run the unchecked body: no flag, no extra frame.
* **What is compared** (one tuple per result, ``_key``): dtype, sizes and device always (kernels
  read with the planned element type, index with the planned sizes, and dereference pointers of
  the planned device); strides only where no ``fixed_layout`` repairs them, and never on a dim of
  size 1 or of an empty tensor (such a stride is never multiplied by a nonzero index). Where
  ``fixed_layout`` follows, a stride difference is repaired by a copy on every call: noted in the
  log once, not a fallback (channels-last propagation makes convolution results do this). The
  storage offset is not compared: every consumer reads it at run time (``data_ptr()`` for kernels,
  ``x.storage_offset()`` in every ``as_strided`` the wrapper writes). A result no consumer plans
  with is not checked at all (``WrapperCodegen._planned_on``): one that is unused, or only passed
  whole to other extern calls (ATen reads the real tensor, and what that call returns is checked
  in turn). A None where a tensor was planned passes (flash attention returns undefined tensors
  for results its meta function makes empty; a consumer would fail loudly, not silently).
* **After a mismatch** the call returns ``fallback(*inputs)``: the graph's ATen code (the same
  path as inputs of unexpected sizes, ``backend._layout_fallback``), run from the original inputs,
  for this call and every later one (the function keeps the first-call code, whose first line
  then goes straight to ATen). Re-running from the inputs is sound because nothing visible has
  happened yet: a native graph writes its inputs only at its very end (``copy_`` of mutated inputs,
  after every extern call; aot's epilogue writes running statistics after the graph returns), the
  kernels that ran wrote only buffers the wrapper allocated, and the inputs are held until the
  last check. A boxed backward graph frees its inputs at their last use, so it checks only the
  extern results made before its first input is dropped (holding a backward's saved activations
  through a late check cost GPT-2 training's first step 0.94 GB on the H100). Random numbers: a graph with a random extern op at or before a checked
  site saves the generators' states at the start of the first call and restores them before the
  ATen run, so the ATen run draws what eager would have drawn. What cannot be undone is an extern
  op's own side effect outside its results (a custom op that prints or counts): it runs twice on
  that one call; the compiler already assumes extern ops are pure (it reorders them).

``EMBER_NATIVE_EXTERN_CHECK=0`` (``config.native_extern_check``) turns the check off (``arm`` returns
the steady-state function): for measurements, and for the tests that show the check matters.
"""
from __future__ import annotations

import logging
import sys
import types
import weakref

import torch

# this process's first-call checks: graphs armed, results compared (``differs`` calls), graphs that
# passed, mismatches found, calls that ran the ATen graph because of one
STATS = {"armed": 0, "compared": 0, "passed": 0, "mismatches": 0, "aten_calls": 0}

log = logging.getLogger("ember.native")

# id(code object) -> _Armed, for each armed function's own copies of its first-call and steady codes:
# ``begin`` and ``recheck`` find the record through their caller's frame (the code cannot name its
# function: that would be one more closure variable in one body than in the other)
_ARMED: dict = {}


class _Armed:
    __slots__ = ("fn", "steady", "first", "first_fn", "steady_fn", "fallback", "sites", "label", "random", "boxed",
                 "failed", "off", "noted")

    def __init__(self, fn, steady, first, fallback, sites, label, random, boxed=False):
        self.fn, self.steady, self.first = weakref.ref(fn), steady, first
        self.fallback, self.sites, self.label, self.random, self.boxed = fallback, sites, label, random, boxed
        self.failed = False
        self.off = False  # config.native_extern_check was off when the graph was bound
        self.noted: set = set()
        # the two codes as functions of their own (same globals and cells): what ``recheck`` calls
        self.first_fn = types.FunctionType(first, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        self.steady_fn = types.FunctionType(steady, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


# results whose device (and form) the op picks at run time, by their schema names: attention's philox
# seed and offset are host tensors outside a CUDA-graph capture and device tensors inside one (Note
# [Seed and Offset] in torch/_meta_registrations.py), and their fakes say one or the other
# (efficient attention's fake: cuda:0; the H100 run of GPT-2 training in fp32 got a host tensor).
# No generated code reads them: they travel to the backward op, which takes either.
RUNTIME_PLACED_RESULTS = frozenset({"philox_seed", "philox_offset", "rng_state", "unused"})


def runtime_placed(target, j: int) -> bool:
    """Is result ``j`` of extern ``target`` one whose placement the op decides (not checked)?"""
    returns = getattr(getattr(target, "_schema", None), "returns", ())
    return j < len(returns) and returns[j].name in RUNTIME_PLACED_RESULTS


def arm(call, first, fallback, sites, label: str = "", random: bool = False, boxed: bool = False):
    """``call`` (the steady-state function ``make_call`` returns), made to run ``first``'s code until
    a first call passes every check. ``fallback(*inputs)`` runs the graph's ATen code; ``sites``:
    (op name, buffer name, result position, device) per check site (the ``site`` of ``differs``);
    ``random``: an extern op drawing random numbers runs at or before a checked site; ``boxed``: the
    functions take their inputs as one list (``release_inputs``)."""
    from ember.config import config
    if call.__code__.co_freevars != first.__code__.co_freevars:  # (a generator bug: the swap would misbind cells)
        raise AssertionError(f"first-call code closes over {first.__code__.co_freevars}, "
                             f"the steady one over {call.__code__.co_freevars}")
    # each code its own copy: the key of this function's record (its frames find it)
    steady, code = call.__code__.replace(), first.__code__.replace()
    rec = _Armed(call, steady, code, getattr(fallback, "aten", fallback), sites, label, random, boxed)
    _ARMED[id(steady)] = _ARMED[id(code)] = rec
    weakref.finalize(call, _forget, id(steady), id(code))
    if config.native_extern_check:
        call.__code__ = code
        STATS["armed"] += 1
    else:  # (steady code throughout; a graph with symbolic sizes still asks ``recheck`` at new sizes)
        rec.off = True
        call.__code__ = steady
    return call


def _forget(*ids):
    for i in ids:
        _ARMED.pop(i, None)


def recheck(inputs: tuple, sizes_checked: set, sizes: tuple):
    """A graph with symbolic sizes called with sizes no first call has checked: this call runs the
    first-call code (the extern results at these sizes are checked; a mismatch runs ATen from now on)."""
    rec = _ARMED[id(sys._getframe(1).f_code)]
    if rec.off:  # (the check is off: these sizes are taken as they come)
        sizes_checked.add(sizes)
        fn = rec.steady_fn
    else:
        fn = rec.first_fn
    return fn(list(inputs)) if rec.boxed else fn(*inputs)


def begin(inputs: tuple) -> "Check":
    """The first-call code's first statement: its graph's check, holding the inputs until the last site."""
    return Check(_ARMED[id(sys._getframe(1).f_code)], inputs)


def _rng_states(devices) -> list:
    states = [(None, torch.random.get_rng_state())]
    for d in devices:
        if d.type == "cuda":
            states.append((d, torch.cuda.get_rng_state(d)))
    return states


def _set_rng_states(states):
    for d, s in states:
        if d is None:
            torch.random.set_rng_state(s)
        else:
            torch.cuda.set_rng_state(s, d)


def _strides_key(sizes, strides):
    """Strides as the code depends on them: none for an empty tensor, none on a dim of size 1."""
    if any(s == 0 for s in sizes):
        return ()
    return tuple(st if s != 1 else None for s, st in zip(sizes, strides))


def _same_device(actual: torch.device, planned: torch.device) -> bool:
    return actual.type == planned.type and (planned.index is None or actual.index in (None, planned.index))


def describe(dtype, sizes, strides, device) -> str:
    return f"{str(dtype).replace('torch.', '')}{list(sizes)} strides {tuple(strides)} on {device}"


class Check:
    """One first call's checks (``begin``). ``failed``: this graph mismatched before (a later call)."""
    __slots__ = ("rec", "inputs", "rng")

    def __init__(self, rec: _Armed, inputs: tuple):
        self.rec, self.inputs = rec, inputs
        self.rng = None
        if rec.random and not rec.failed:
            self.rng = _rng_states({torch.device(s[3]) for s in rec.sites})

    @property
    def failed(self) -> bool:
        return self.rec.failed

    def differs(self, site: int, t, dtype, sizes, strides, device, repaired: bool) -> bool:
        """Does extern result ``t`` differ from the planned metadata in a way the code depends on?
        On a difference: logged, counted, and this graph runs its ATen code from now on."""
        STATS["compared"] += 1
        if t is None:
            return False
        if not isinstance(t, torch.Tensor):
            return self._mismatch(site, f"a {type(t).__name__}", dtype, sizes, strides, device)
        tsizes = tuple(t.shape)
        if t.dtype != dtype or tsizes != tuple(sizes) or not _same_device(t.device, device):
            return self._mismatch(site, describe(t.dtype, tsizes, t.stride(), t.device), dtype, sizes, strides, device)
        if _strides_key(tsizes, t.stride()) != _strides_key(tsizes, strides):
            if not repaired:
                return self._mismatch(site, describe(t.dtype, tsizes, t.stride(), t.device), dtype, sizes, strides, device)
            if site not in self.rec.noted:  # (fixed_layout copies it into the planned strides, every call)
                self.rec.noted.add(site)
                op, buf, pos = self.rec.sites[site][:3]
                log.info("ember.native: %sextern %s (%s, result %d) returned strides %s where %s was planned: "
                         "copied into the planned strides on every call (fixed_layout)",
                         self.rec.label, op, buf, pos, tuple(t.stride()), tuple(strides))
        return False

    def _mismatch(self, site, actual, dtype, sizes, strides, device) -> bool:
        return self._fail(site, actual, describe(dtype, sizes, strides, device))

    def _fail(self, site, actual: str, planned: str) -> bool:
        rec = self.rec
        rec.failed = True
        STATS["mismatches"] += 1
        fn = rec.fn()
        if fn is not None:  # (another thread's first call may have passed meanwhile)
            fn.__code__ = rec.first
        op, buf, pos = rec.sites[site][:3]
        reason = (f"{rec.label}extern {op} ({buf}, result {pos}) returned {actual} where the compiled code "
                  f"was planned for {planned} (the op's fake/meta function said so)")
        log.warning("ember.native: %s: the graph runs its ATen code, for this call and every later one", reason)
        from ember.diagnostics import counters
        counters.eager_fallback("native_extern_meta", reason)
        if self.rng is not None:  # (the ATen run draws the numbers eager would have drawn)
            _set_rng_states(self.rng)
        return True

    def aten(self):
        """The graph's ATen code on the inputs of this call."""
        STATS["aten_calls"] += 1
        inputs, self.inputs = self.inputs, ()
        return self.rec.fallback(*inputs)

    def passed(self, sizes_checked: set | None = None, sizes: tuple = ()):
        """Every check passed: later calls run the steady-state code; the inputs are let go. A graph
        with symbolic sizes remembers these sizes (other sizes are checked at their first call)."""
        self.inputs = ()
        rec = self.rec
        if not rec.failed:
            fn = rec.fn()
            if fn is not None:
                fn.__code__ = rec.steady
            if sizes_checked is not None:
                sizes_checked.add(sizes)
            STATS["passed"] += 1
