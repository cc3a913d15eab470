"""CPU seconds of the cache stores in a cold compile of compile_time.py's 24-layer Llama at tiny widths
(issue 29 probe, session 38): main-thread CPU (``time.thread_time``) of the first call and of the aot
and frontend cache stores, in this process with an empty cache.

    python benchmarks/probes/llama_cold_stores.py train      # or: infer

'fe record_of' holds the one full GC collection that follows the compile (it fires there).
"""
import collections
import os
import sys
import tempfile
import time

os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp()
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import ember  # noqa: E402
import ember.aot  # noqa: E402,F401
import ember.aot.cache as AC  # noqa: E402
import ember.aot.deferred as D  # noqa: E402
import ember.frontend.convert  # noqa: E402,F401
import ember.frontend.persist as P  # noqa: E402
import ember.native.backend  # noqa: E402,F401

torch.set_num_threads(1)
T = collections.defaultdict(float)


def wrap(owner, name, label):
    f = getattr(owner, name)

    def timed(*a, **k):
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            T[label] += time.thread_time() - t
    setattr(owner, name, timed)


wrap(AC, "store", "aot store")
wrap(AC, "graph_data", "aot graph_data")
wrap(D, "_auto_facts", "auto facts")
wrap(P, "store", "fe store")
wrap(P, "record_of", "fe record_of")
wrap(AC._Pickler, "dump", "aot+fe pickle dump")
wrap(AC._Restricted, "load", "restricted load")
train = (sys.argv[1] if len(sys.argv) > 1 else "train") == "train"
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
cfg._attn_implementation = "sdpa"
m = LlamaForCausalLM(cfg)
ids = torch.randint(0, 128, (1, 16))
cm = ember.compile(m)
t = time.thread_time()
if train:
    cm(ids, labels=ids).loss.backward()
else:
    m.eval()
    with torch.no_grad():
        cm(ids)
print("first cpu", round(time.thread_time() - t, 3), {k: round(v, 3) for k, v in T.items()})
