"""Probe: memory of one GPT-2 training step, eager against ember, counted exactly on any device.

    python benchmarks/probes/train_memory.py [--device cpu|cuda] [--preset small|gpt2-small] [--autocast]

Counts, per mode, over one training step after a warm-up step (the compile):
- ``peak_live_bytes``: the most bytes of tensor storages alive at once during the step, beyond what was
  alive before it. Every storage an ATen op creates is counted from its creation to the moment its
  last reference goes (a dispatch mode sees each op; a finalizer on each storage sees it die), so no
  allocator caching hides a free. On CPU the native backend runs its Triton kernels in the interpreter
  (EMBER_NATIVE_FORCE_TRITON=1, TRITON_INTERPRET=1): the same wrappers, buffer lifetimes and
  partition as on a GPU.
- ``saved_bytes``: distinct storages autograd keeps for the backward (saved-tensor hooks), parameters
  excluded: what the partitioner decided to save.
- on CUDA also ``cuda_peak_bytes`` (``max_memory_allocated`` over the step, minus before it).
Prints one ``TRAIN_MEMORY {json}`` line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import weakref

PRESETS = {
    "tiny": dict(n_layer=2, n_embd=64, n_head=4, batch=2, seq=32, vocab=512),  # CPU, Triton interpreter
    "small": dict(n_layer=2, n_embd=128, n_head=4, batch=4, seq=128, vocab=2048),
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, batch=8, seq=512, vocab=50257),
}


class LiveBytes:
    """A dispatch mode counting live storage bytes (created by ATen ops) and their peak."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                outer._note(out)
                return out
        self.mode = Mode()
        self.live = self.peak = 0
        self.ptrs: set = set()

    def _note(self, out):
        import torch
        import torch.utils._pytree as pytree
        from torch._subclasses.fake_tensor import FakeTensor
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr in self.ptrs or st.nbytes() == 0:
                continue
            n = st.nbytes()
            self.ptrs.add(ptr)
            self.live += n
            self.peak = max(self.peak, self.live)
            weakref.finalize(st, self._free, ptr, n)

    def _free(self, ptr, n):
        self.ptrs.discard(ptr)
        self.live -= n

    def reset_peak(self):
        self.peak = self.live


def build(preset: dict, dev: str):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=preset["n_layer"], n_embd=preset["n_embd"], n_head=preset["n_head"],
                     vocab_size=preset["vocab"], n_positions=max(1024, preset["seq"]))
    cfg._attn_implementation = "sdpa"
    m = GPT2LMHeadModel(cfg).to(dev)
    ids = torch.randint(0, preset["vocab"], (preset["batch"], preset["seq"]), device=dev)
    return m, ids


def measure(mode: str, preset: dict, dev: str, use_autocast: bool) -> dict:
    import torch
    m, ids = build(preset, dev)
    run = m
    if mode == "ember":
        import ember
        run = ember.compile(m)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    counter = LiveBytes()
    saved: dict = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    def step():
        with torch.autocast(dev.split(":")[0], dtype=torch.bfloat16, enabled=use_autocast):
            loss = run(ids, labels=ids).loss
        loss.backward()
        return loss.detach()

    step()  # warm-up: compile (outside the counting mode), and the gradients' first allocation
    m.zero_grad(set_to_none=True)
    with counter.mode:
        step()  # (a recompile for the mode, if any, happens here)
        m.zero_grad(set_to_none=True)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before_cuda = torch.cuda.memory_allocated()
        counter.reset_peak()
        base = counter.live
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = step()
    rec = dict(mode=mode, peak_live_bytes=counter.peak - base, saved_bytes=sum(saved.values()), loss=float(loss))
    if dev.startswith("cuda"):
        rec["cuda_peak_bytes"] = torch.cuda.max_memory_allocated() - before_cuda
    return rec


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default=None)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--autocast", action="store_true")
    p.add_argument("--modes", default="eager,ember")
    a = p.parse_args()
    dev = a.device
    if dev is None:
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("EMBER_NATIVE_FORCE_TRITON", "1")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = dict(device=dev, preset=a.preset, autocast=a.autocast, config=PRESETS[a.preset])
    for mode in a.modes.split(","):
        out[mode] = measure(mode, PRESETS[a.preset], dev, a.autocast)
    if "eager" in out and "ember" in out:
        for k in ("peak_live_bytes", "saved_bytes", "cuda_peak_bytes"):
            if k in out["ember"] and out["eager"].get(k):
                out[f"{k}_ember_over_eager"] = round(out["ember"][k] / out["eager"][k], 3)
    print("TRAIN_MEMORY " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
