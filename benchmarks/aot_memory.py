"""Peak memory of one GPT-2 training step: eager vs ``ember.compile(backend="aot_eager")``.

The autograd layer's partitioner decides what the forward keeps for the backward, so the number to
watch is the memory a training step needs beyond the model's own state (weights, gradients, optimizer
state). Both runs use the same weights, the same batch and the same seed; each mode gets warm-up steps
first (compilation included), then the measured steps.

    python benchmarks/aot_memory.py                       # GPT-2 small (124M) on CUDA if present
    python benchmarks/aot_memory.py --device cpu --small  # a 2-layer model on CPU: checks the script
    python benchmarks/aot_memory.py --n-layer 6 --seq 1024  # any field of the preset can be overridden

Measures, per mode:
- ``peak_step_bytes``: peak allocated memory during the step minus what was allocated before it. CUDA:
  ``torch.cuda.max_memory_allocated``. CPU: bytes in use on the C heap (glibc ``mallinfo2``: small
  blocks + mmapped blocks), sampled after every ATen op by a dispatch mode, so allocator caching does
  not hide frees (needs glibc; the field is null elsewhere).
- ``held_for_backward_bytes``: memory still allocated when the forward returns (the loss computed),
  minus the pre-step baseline: the activations kept for the backward.
- ``saved_tensor_bytes``: the distinct storages autograd saved for the backward (saved-tensor hooks),
  parameters excluded; device-independent and exact.

Writes ``benchmarks/results/aot_memory_<device>.json``.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import platform
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ember  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

PRESETS = {
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, batch=4, seq=512, vocab=50257),
    # small enough for a CPU check; a small vocabulary so that activations, not logits, dominate
    "small": dict(n_layer=2, n_embd=128, n_head=4, batch=4, seq=128, vocab=2048),
}


# ------------------------------------------------------------------------------------ memory probes

class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_reader():
    """A function returning the bytes in use on the C heap, or None without glibc's mallinfo2."""
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path)
        fn = libc.mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = _MallInfo2

    def read() -> int:
        info = fn()
        return int(info.uordblks + info.hblkhd)
    return read


class _PeakSampler(TorchDispatchMode):
    """Samples heap use after every ATen op (forward, backward and compiled graphs alike)."""

    def __init__(self, read):
        super().__init__()
        self.read, self.peak = read, read()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.read())
        return out


class Probe:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.read = None if self.cuda else _heap_reader()
        self.kind = "torch.cuda.max_memory_allocated" if self.cuda else (
            "glibc mallinfo2 (uordblks + hblkhd), sampled per ATen op" if self.read else "unavailable")

    def allocated(self):
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return self.read() if self.read else None

    def start_peak(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return None
        return _PeakSampler(self.read) if self.read else None

    def peak(self, sampler):
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return sampler.peak if sampler else None


# ---------------------------------------------------------------------------------------------- model

def build(preset: dict, device):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=preset["n_layer"], n_embd=preset["n_embd"], n_head=preset["n_head"],
                     n_positions=max(1024, preset["seq"]), vocab_size=preset["vocab"])
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).to(device).train()


def lm_loss(model, ids):
    # the loss is computed outside the model (HF's loss helper is a graph break in ember's frontend)
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def measure(model, ids, probe: Probe, warmup: int, steps: int) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            result = dict(peak_step_bytes=0, held_for_backward_bytes=0, saved_tensor_bytes=0)
        opt.zero_grad(set_to_none=True)
        gc.collect()
        measured = i >= warmup
        saved: dict[int, int] = {}

        def pack(t):
            if measured:
                ptr = t.untyped_storage().data_ptr()
                if ptr not in params:
                    saved[ptr] = t.untyped_storage().nbytes()
            return t

        torch.manual_seed(1234 + i)
        base = probe.allocated()
        sampler = probe.start_peak() if measured else None
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), (sampler or _null()):
            loss = lm_loss(model, ids)
            after_fw = probe.allocated()
            loss.backward()
        peak = probe.peak(sampler) if measured else None
        opt.step()
        if probe.cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if measured:
            result["loss"] = loss.item()
            if base is not None:
                result["peak_step_bytes"] = max(result["peak_step_bytes"], peak - base)
                result["held_for_backward_bytes"] = max(result["held_for_backward_bytes"], after_fw - base)
            result["saved_tensor_bytes"] = max(result["saved_tensor_bytes"], sum(saved.values()))
    # timed on the warm-up steps after the first (compilation): the CPU probe slows measured steps down
    result["step_seconds"] = min(times[1:warmup] or times[warmup:])
    result["first_step_seconds"] = times[0]
    return result


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="2 layers, width 128, seq 128, vocab 2048 (CPU check)")
    for key in ("n_layer", "n_embd", "n_head", "batch", "seq", "vocab"):
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, dest=key)
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps; all but the first are timed")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    preset = dict(PRESETS["small" if args.small or device.type == "cpu" and args.n_layer is None else "gpt2-small"])
    preset.update({k: getattr(args, k) for k in preset if getattr(args, k, None) is not None})
    probe = Probe(device)
    torch.manual_seed(0)
    ids = torch.randint(0, preset["vocab"], (preset["batch"], preset["seq"]), device=device)

    report = dict(benchmark="aot_memory", device=str(device), config=preset, probe=probe.kind,
                  torch=torch.__version__, python=platform.python_version(),
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    for mode in ("eager", "aot_eager"):
        model = build(preset, device)
        runner = model if mode == "eager" else ember.compile(model, backend="aot_eager")
        report[mode] = measure(runner, ids, probe, args.warmup, args.steps)
        del model, runner
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    e, a = report["eager"], report["aot_eager"]
    report["loss_abs_diff"] = abs(e["loss"] - a["loss"])
    for key in ("peak_step_bytes", "held_for_backward_bytes", "saved_tensor_bytes"):
        if e.get(key):
            report[f"{key}_ratio_aot_over_eager"] = round(a[key] / e[key], 4)

    os.makedirs(RESULTS, exist_ok=True)
    out = args.out or os.path.join(RESULTS, f"aot_memory_{device.type}.json")
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    mib = lambda n: f"{n / 2**20:8.1f} MiB" if isinstance(n, (int, float)) else "     n/a"  # noqa: E731
    print(f"GPT-2 {preset} on {device} ({probe.kind})")
    for key in ("peak_step_bytes", "held_for_backward_bytes", "saved_tensor_bytes"):
        print(f"  {key:<26} eager {mib(e.get(key))}   aot_eager {mib(a.get(key))}")
    print(f"  step time                  eager {e['step_seconds']:8.3f} s     aot_eager {a['step_seconds']:8.3f} s")
    print(f"  loss eager {e['loss']:.6f}  aot_eager {a['loss']:.6f}\nwrote {out}")
    return report


if __name__ == "__main__":
    main()
