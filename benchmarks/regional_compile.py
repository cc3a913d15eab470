"""Regional compilation against whole-model compilation: GPT-2 with 12 and 24 layers (issue 29).

    python benchmarks/regional_compile.py                       # cuda if present, else cpu
    python benchmarks/regional_compile.py --device cpu          # small widths: runs on a laptop
    python benchmarks/regional_compile.py --train               # forward + backward steps
    python benchmarks/regional_compile.py --model bert --layers 12   # gpu_suite's bert_infer model
    python benchmarks/regional_compile.py --model llama --layers 24 [--train]   # compile_time.py's 1B Llama
    python benchmarks/regional_compile.py --out benchmarks/results/regional_compile-h100.json

Rows: one fresh process per (layers, whole | regional), each with empty ember and Triton caches,
so the first call is a cold compile. Models: on cuda GPT-2 124M's widths (n_embd 768, 12 heads),
batch 8 x 512, bf16 weights for inference (gpu_suite's gpt2_infer; training: fp32 weights under
bf16 autocast), BERT-base batch 16 x 256 bf16 for ``--model bert``, ``compile_time.py``'s ~1B Llama
for ``--model llama`` (hidden 2048, bf16 weights, one sequence of 512 tokens; training: loss, backward
and a fused AdamW step, as its ``llama_train`` row); on cpu n_embd 64, 4 heads, batch 2 x 32, fp32
(one intra-op thread). ``--auto`` adds a third row per depth compiled with no ``regional`` option
(the automatic choice, ``ember.config.regional_auto_block_params``). Per row:

- ``compile_s``: the first call, imports and model building excluded (wall; ``compile_cpu_s``: this
  process's CPU time, the steadier number on a shared machine);
- ``steady_ms``: median over 5 loops of ``--steps`` calls between two synchronizations;
- ``host_ms``: one call's time from entry to return right after a synchronization (median of 20):
  on cuda that is the host work of a step (kernels are only enqueued), on cpu the whole step;
- ``kernels``: device kernels per step (cuda: CUDA kernels in a torch.profiler trace of one step, with
  the five costliest in ``top``); on cpu the native backend's C++ kernels and extern ATen calls
  (``ember.testing.KernelCount``);
- ``max_err``: largest absolute difference from eager (inference).

Then the checks of the acceptance point are printed: regional compile time of 24 layers at most
1.2 x that of 12, and regional steady time within 3% of whole-model compilation at each depth.
CPU timings on a shared machine are noise; compare kernels and CPU times there.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def build(model: str, layers: int, device: str, train: bool):
    """(model, input ids, dtype of the autocast region or None)."""
    import torch
    cuda = device.startswith("cuda")
    if model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = (LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048) if cuda else
               LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=128, max_position_embeddings=64))
        cfg._attn_implementation = "sdpa"
        m = LlamaForCausalLM(cfg).to(device, torch.bfloat16 if cuda else torch.float32)
        if not train:
            m = m.eval()
        return m, torch.randint(0, cfg.vocab_size, (1, 512) if cuda else (1, 16), device=device), None
    if model == "bert":
        from transformers import BertConfig, BertModel
        cfg = (BertConfig(num_hidden_layers=layers) if cuda else
               BertConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, intermediate_size=256,
                          vocab_size=512))
        cfg._attn_implementation = "sdpa"
        m, shape = BertModel(cfg), ((16, 256) if cuda else (2, 32))
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = (GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024) if cuda else
               GPT2Config(n_layer=layers, n_embd=64, n_head=4, n_positions=64, vocab_size=512))
        cfg._attn_implementation = "sdpa"
        m, shape = GPT2LMHeadModel(cfg), ((8, 512) if cuda else (2, 32))
    m = m.to(device)
    if not train:
        m = m.eval()
        if cuda:
            m = m.to(torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, shape, device=device)
    return m, ids, (torch.bfloat16 if train and cuda else None)


def make_step(fn, model: str, ids, train: bool, autocast, params=None):
    import torch

    def pick(out):
        return out.last_hidden_state if model == "bert" else out.logits

    if model == "llama" and train:  # compile_time.py's llama_train step
        opt = torch.optim.AdamW(params, lr=1e-5, fused=ids.device.type == "cuda")

        def step():
            loss = fn(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step

    if not train:
        def step():
            with torch.no_grad():
                return pick(fn(ids))
        return step

    def step():
        with torch.autocast(ids.device.type, dtype=autocast, enabled=autocast is not None):
            out = fn(ids, labels=ids) if model == "gpt2" else fn(ids)
            loss = out.loss if model == "gpt2" else out.last_hidden_state.float().pow(2).mean()
        loss.backward()
        return loss.detach()
    return step


def child(a) -> dict:
    import torch
    cuda = a.device.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    import ember
    from ember.testing import KernelCount

    def sync():
        if cuda:
            torch.cuda.synchronize()

    torch.manual_seed(0)
    m, ids, autocast = build(a.model, a.layers, a.device, a.train)
    ref = None if a.train else make_step(m, a.model, ids, False, None)().float()
    counter = KernelCount().__enter__() if not cuda else None  # (counts the graphs compiled from here on)
    c = ember.compile(m, options={} if a.regional == 2 else {"regional": bool(a.regional)})
    step = make_step(c, a.model, ids, a.train, autocast, list(m.parameters()))
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    out = step()
    sync()
    row = dict(model=a.model, layers=a.layers, regional="auto" if a.regional == 2 else bool(a.regional), train=a.train,
               device=a.device,
               compile_s=round(time.perf_counter() - t0, 3), compile_cpu_s=round(time.process_time() - c0, 3))
    if ref is not None:
        row["max_err"] = float((out.float() - ref).abs().max())
    for _ in range(3):
        step()
    sync()
    loops = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        sync()
        loops.append((time.perf_counter() - t0) / a.steps * 1e3)
    row["steady_ms"] = round(statistics.median(loops), 4)
    hosts = []
    for _ in range(20):
        sync()
        t0 = time.perf_counter()
        step()
        hosts.append((time.perf_counter() - t0) * 1e3)
    sync()
    row["host_ms"] = round(statistics.median(hosts), 4)
    if cuda:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        row["kernels"] = len(kernels)
        by_name: dict = {}
        for e in kernels:
            by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time
        row["top"] = [(n[:60], round(t, 1)) for n, t in sorted(by_name.items(), key=lambda kv: -kv[1])[:5]]
    else:
        counter.reset()
        step()
        row["kernels"], row["externs"] = counter.kernels, counter.externs
        counter.__exit__(None, None, None)
    from ember.backends import regional
    row["regional_stats"] = dict(regional.stats())
    return row


def run_row(a, layers: int, regional) -> dict:
    with tempfile.TemporaryDirectory(prefix="ember-regional-") as tmp:
        env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(tmp, "ember"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--layers", str(layers), "--regional",
               str(2 if regional == "auto" else int(regional)), "--device", a.device, "--model", a.model, "--steps", str(a.steps)]
        if a.train:
            cmd.append("--train")
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return dict(layers=layers, regional=regional, error=(p.stderr or p.stdout)[-2000:])
    return json.loads(lines[-1])


def checks(rows: list) -> list:
    """(what, value, passed) for the acceptance point."""
    get = {(r["layers"], r["regional"]): r for r in rows if "error" not in r}
    out = []
    depths = sorted({r["layers"] for r in rows})
    if len(depths) >= 2 and (depths[0], True) in get and (depths[-1], True) in get:
        ratio = get[(depths[-1], True)]["compile_s"] / get[(depths[0], True)]["compile_s"]
        out.append((f"regional compile {depths[-1]} / {depths[0]} layers", round(ratio, 3), ratio <= 1.2))
    for d in depths:
        if (d, True) in get and (d, False) in get:
            ratio = get[(d, True)]["steady_ms"] / get[(d, False)]["steady_ms"]
            out.append((f"{d} layers: steady regional / whole", round(ratio, 4), abs(ratio - 1) <= 0.03))
        if (d, "auto") in get and (d, False) in get:
            ratio = get[(d, "auto")]["steady_ms"] / get[(d, False)]["steady_ms"]
            out.append((f"{d} layers: steady auto / whole", round(ratio, 4), ratio <= 1.03))
    return out


def _kind(r) -> str:
    return "auto" if r["regional"] == "auto" else "regional" if r["regional"] else "whole"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--model", choices=("gpt2", "bert", "llama"), default="gpt2")
    ap.add_argument("--auto", action="store_true", help="also a row with the automatic choice (no regional option)")
    ap.add_argument("--layers", default="12,24", help="comma-separated depths")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="calls per timed loop (default: 20 cuda, 5 cpu)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per row")
    ap.add_argument("--out", default=None, help="write the rows and checks as JSON here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--regional", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.device is None:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.steps is None:
        a.steps = 20 if a.device.startswith("cuda") else 5
    if a.child:
        a.layers = int(a.layers)
        print(json.dumps(child(a)))
        return
    rows = []
    for layers in [int(x) for x in a.layers.split(",")]:
        for regional in (False, True, "auto") if a.auto else (False, True):
            row = run_row(a, layers, regional)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print("| layers | compile | compile s | compile CPU s | steady ms | host ms | kernels/step |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['layers']} | {_kind(r)} | error: {r['error'].splitlines()[-1]} |")
            continue
        k = f"{r['kernels']}" + (f" + {r['externs']} extern" if "externs" in r else "")
        print(f"| {r['layers']} | {_kind(r)} | {r['compile_s']} | {r['compile_cpu_s']} | "
              f"{r['steady_ms']} | {r['host_ms']} | {k} |")
    result = checks(rows)
    print()
    for what, value, ok in result:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {value}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(argv=sys.argv[1:], rows=rows, checks=result), f, indent=1)


if __name__ == "__main__":
    main()
