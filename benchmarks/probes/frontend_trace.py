"""Frontend trace time (issue 29): ``ember.frontend.convert._compile`` CPU seconds with a backend that
compiles nothing (so only the frontend is timed), for compile_time.py's 24-layer Llama at tiny widths
(as llama_cold.py) or a 12-layer GPT-2, each frontend speedup off and on, paired and interleaved in
one process after a warm-up trace (frontend cache off, so every round traces).

    python benchmarks/probes/frontend_trace.py                          # Llama inference, the fake memo
    python benchmarks/probes/frontend_trace.py --train --rounds 3
    python benchmarks/probes/frontend_trace.py --model gpt2 --layers 12
    python benchmarks/probes/frontend_trace.py --switches pytree         # the pytree-free argument maps

Switches: config fields (``frontend_fake_memo``) or ``pytree`` (OutputGraph.call's leaf fast path,
patched back to pytree's walk when off). Prints min and median per side and the on/off median ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def build_model(name: str, layers: int):
    import torch
    torch.manual_seed(0)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
        cfg._attn_implementation = "sdpa"
        return LlamaForCausalLM(cfg)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=128, n_positions=64)
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama", choices=("llama", "gpt2"))
    p.add_argument("--train", action="store_true")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--switches", default="frontend_fake_memo", help="comma list (see the docstring)")
    a = p.parse_args()
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="frontend_trace_")
    import torch
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    import ember
    import ember.frontend.convert as convert
    import ember.frontend.output_graph as og
    from ember.config import config
    config.frontend_cache = False  # (every round traces)
    m = build_model(a.model, a.layers)
    m.train() if a.train else m.eval()
    ids = torch.randint(0, 128, (1, 16))
    spent = [0.0]
    inner = convert._compile

    def timed(*args, **kwargs):
        c = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - c
    convert._compile = timed
    patches = {"pytree": [(og, "_flat_leaves", lambda args, kwargs: False), (og, "_has_class", lambda obj: None)]}
    saved = {(mod, name): getattr(mod, name) for items in patches.values() for mod, name, _ in items}
    switches = [s for s in a.switches.split(",") if s]

    def trace(on: bool) -> float:
        for s in switches:
            if s in patches:
                for mod, name, off in patches[s]:
                    setattr(mod, name, saved[(mod, name)] if on else off)
            else:
                setattr(config, s, on)
        ember.reset()
        spent[0] = 0.0
        cm = ember.compile(m, backend=lambda gm, example_inputs: gm.forward)
        if a.train:
            cm(ids, labels=ids).loss.backward()
        else:
            with torch.no_grad():
                cm(ids)
        return spent[0]

    trace(True)  # warm-up: imports, torch's first-use caches
    runs = {False: [], True: []}
    for i in range(a.rounds):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            runs[on].append(trace(on))

    def show(xs):
        return f"min {min(xs):.3f} median {statistics.median(xs):.3f}"
    ratio = statistics.median(runs[True]) / statistics.median(runs[False])
    print(f"{a.model} {'train' if a.train else 'infer'} {a.layers} layers, frontend _compile CPU s, switches "
          f"{switches}: off {show(runs[False])} | on {show(runs[True])} | on/off median {ratio:.3f}")


if __name__ == "__main__":
    main()
