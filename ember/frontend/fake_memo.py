"""Replay of fake-tensor propagation for a call already propagated with the same metadata.

Every graph call runs its op on fake tensors to learn the result's metadata (``OutputGraph.call``).
A model's repeated layers make the same calls on tensors of the same metadata again and again: a
24-layer Llama's inference trace ran ~1,600 calls through FakeTensorMode, over half the frontend's
time, though only one layer's worth of them were distinct. FakeTensorMode's own cache keys every
ATen op under the call (a composite op is several) and rebuilds each result from it; this memo
keys the whole call once and makes the result tensor directly, as that cache does for one op.

A key is the call (kind, target), the state that can change what an op returns (grad mode, default
dtype, autocast, the SDPA / cuDNN / oneDNN switches; no call is keyed under a torch function or
dispatch mode; of these only grad mode and autocast change inside one trace, the setters of the others
being graph breaks: output_graph._changes_global_state) and each argument: a fake tensor of this trace by its metadata (type, sizes, strides,
storage offset, dtype, device, requires_grad) and which earlier argument it is (``f(x, x)``), a
plain value by type and value, containers by their items. Anything else (a symbolic size, a real
tensor, a device other than CPU / CUDA / meta, an object) makes the call unkeyed: it runs as before.

A result is kept only where replaying it cannot differ from running the op: every output a fresh
tensor (not an argument, no view, its own storage, no constant, strided, not complex; one that needs
grad a non-leaf) and no argument written (its version counter did not move: batch norm's running
statistics). On the first run of a key the replayed tensors are compared with the propagated ones
(sizes, strides, offset, storage bytes, dtype, device, requires_grad, leaf-ness, version, dispatch
keys, attributes); a call that does not match is never replayed. ``config.frontend_fake_memo`` off
propagates every call (tests/frontend/test_trace_speedups.py compares both).
"""
from __future__ import annotations

import types

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

_PLAIN = frozenset({int, float, bool, str, complex, type(None), type(Ellipsis), torch.dtype, torch.device,
                    torch.memory_format, torch.layout})
_DEVICES = ("cpu", "cuda", "meta")  # (the autocast state of these is in the key)
_NEVER = object()  # a key whose call is not replayable (it wrote an argument, returned a view...)


class _Unkeyed(Exception):
    pass


def global_key() -> tuple:
    """What outside the arguments can change an op's result metadata (or whether it needs grad)."""
    C = torch._C
    if C._len_torch_function_stack() or C._len_torch_dispatch_stack():
        raise _Unkeyed  # a mode (a user's, torch.device(...) as a context) may answer anything
    if C.is_inference_mode_enabled():
        raise _Unkeyed  # (inference tensors have no version counter: whether a call wrote an argument is unknown)
    return (C.is_grad_enabled(), torch.get_default_dtype(), C.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cpu"), torch.get_autocast_dtype("cuda"),
            C._get_flash_sdp_enabled(), C._get_mem_efficient_sdp_enabled(), C._get_math_sdp_enabled(),
            C._get_cudnn_sdp_enabled(), C._get_cudnn_enabled(), C._get_mkldnn_enabled())


class FakeMemo:
    """One trace's memo (OutputGraph.fake_memo)."""

    def __init__(self, fake_mode) -> None:
        self.fake_mode = fake_mode
        self.entries: dict = {}
        self.hits = 0

    def key(self, kind: str, target, fake_args) -> tuple | None:
        """The call's key, or None when it has none (then it runs as before)."""
        tensors: list = []
        try:
            args_key = self._key(fake_args, tensors)
            if not tensors:
                return None  # (factories read the default device: not worth keying)
            key = (kind, target, global_key(), args_key)
            hash(key)
        except (_Unkeyed, TypeError):
            return None
        return key

    def _key(self, obj, tensors: list):
        t = type(obj)
        if t in _PLAIN:
            return t, obj
        if t is FakeTensor:
            if obj.fake_mode is not self.fake_mode or obj.constant is not None or obj.is_inference() \
                    or obj._has_symbolic_sizes_strides \
                    or obj.layout is not torch.strided or obj.dtype.is_complex or obj.is_nested \
                    or obj.fake_device.type not in _DEVICES:
                raise _Unkeyed
            same = next((i for i, u in enumerate(tensors) if u is obj), -1)
            tensors.append(obj)
            return (t, tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype, obj.fake_device,
                    obj.requires_grad, same)
        if t is tuple or t is list or t is torch.Size:
            return t, tuple(self._key(x, tensors) for x in obj)
        if t is dict:
            return t, tuple((k, self._key(v, tensors)) for k, v in obj.items())
        if t is slice:
            return t, self._key(obj.start, tensors), self._key(obj.stop, tensors), self._key(obj.step, tensors)
        raise _Unkeyed

    def replay(self, key, fake_args):
        """The memo's result for ``key`` (fresh fake tensors), or None where the call must run."""
        entry = self.entries.get(key)
        if entry is None or entry is _NEVER:
            return None
        try:
            out = self._replay(entry, fake_args)
        except Exception:  # noqa: BLE001 - never break a trace over the memo: this call propagates instead
            self.entries[key] = _NEVER
            return None
        self.hits += 1
        return out

    def _replay(self, entry, fake_args):
        kind, metas = entry
        outs = [self._make(m) for m in metas]
        if any(m[-1] for m in metas):
            # results that need grad are non-leaves in the trace: an autograd node of their own,
            # over the arguments that need grad, makes them so without running the op (the tracer
            # never reads a fake's grad_fn, only requires_grad / is_leaf)
            outs = _Replayed.apply(outs, [m[-1] for m in metas],
                                   *[t for t in _tensors(fake_args) if t.requires_grad])
            outs = list(outs) if isinstance(outs, tuple) else [outs]
        return outs[0] if kind is None else kind(outs)

    def before(self, fake_args) -> list | None:
        """The argument tensors and their version counters, read before the first run of a key (None:
        one has none, the call is not kept)."""
        try:
            return [(t, t._version) for t in _tensors(fake_args)]
        except RuntimeError:  # (an inference tensor: keyed calls have none, but the memo must never break a trace)
            return None

    def record(self, key, fake_args, versions: list, result) -> None:
        """After the first run of ``key``: keep its result if replaying it gives the same tensors.
        Never raises: a result it cannot read is simply not kept."""
        self.entries[key] = _NEVER
        try:
            self._record(key, fake_args, versions, result)
        except Exception:  # noqa: BLE001 - the memo is an optimization: the call was propagated already
            self.entries[key] = _NEVER

    def _record(self, key, fake_args, versions: list, result) -> None:
        if any(t._version != v for t, v in versions):
            return  # the op wrote an argument: a replay would not
        if type(result) is FakeTensor:
            kind, outs = None, [result]
        elif type(result) in (tuple, list) and result and all(type(r) is FakeTensor for r in result):
            kind, outs = type(result), list(result)
        else:
            return
        args = [t for t, _ in versions]
        storages = [t.untyped_storage() for t in args]
        metas = []
        for out in outs:
            if any(out is a for a in args) or out._is_view() or (out.requires_grad and out.is_leaf) \
                    or out.constant is not None or out.layout is not torch.strided or out.dtype.is_complex \
                    or out._has_symbolic_sizes_strides or out.is_nested or out.fake_mode is not self.fake_mode:
                return
            st = out.untyped_storage()
            if any(st._cdata == s._cdata for s in storages):
                return
            storages.append(st)
            metas.append((tuple(out.shape), out.stride(), out.storage_offset(), out.dtype, out.fake_device,
                          out.requires_grad))
        entry = (kind, metas)
        again = self._replay(entry, fake_args)
        if all(_same(a, b) for a, b in zip(outs, [again] if kind is None else again)):
            self.entries[key] = entry

    def _make(self, meta) -> FakeTensor:
        shape, stride, offset, dtype, device, _ = meta
        with in_kernel_invocation_manager(self.fake_mode):
            empty = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        return FakeTensor(self.fake_mode, empty, device)


class _Replayed(torch.autograd.Function):
    """Hands back the replayed tensors as outputs of an autograd node (``needs[i]``: output i needs grad)."""

    @staticmethod
    def forward(ctx, outs, needs, *inputs):
        ctx.mark_non_differentiable(*[o for o, n in zip(outs, needs) if not n])
        return tuple(outs) if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("ember: a traced fake tensor was differentiated")


def _tensors(obj) -> list:
    out = []

    def walk(x):
        t = type(x)
        if t is FakeTensor:
            out.append(x)
        elif t is tuple or t is list:
            for y in x:
                walk(y)
        elif t is dict:
            for y in x.values():
                walk(y)
    walk(obj)
    return out


def _same(a: FakeTensor, b: FakeTensor) -> bool:
    """Would code reading ``a`` see anything different in ``b``? (what a fake tensor can answer)"""
    return (a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
            and a.dtype == b.dtype and a.fake_device == b.fake_device and a.device == b.device
            and a.requires_grad == b.requires_grad and a.is_leaf == b.is_leaf
            and (a.grad_fn is None) == (b.grad_fn is None)
            and a._version == b._version and a.untyped_storage().nbytes() == b.untyped_storage().nbytes()
            and a.is_contiguous() == b.is_contiguous() and a._is_view() == b._is_view()
            and a.is_conj() == b.is_conj() and a.is_neg() == b.is_neg()
            and torch._C._dispatch_keys(a) == torch._C._dispatch_keys(b)
            and _attrs(a) == _attrs(b))


def _attrs(t) -> dict:
    return {k: (v if isinstance(v, (types.NoneType, bool, int, str, torch.device, type)) else type(v))
            for k, v in vars(t).items()}
