"""Probe (issue 29, session 42): BERT-base inference (gpu_suite bert_infer) compiled by ember on CUDA: first call,
steady step time over 100 calls and error against eager, with EMBER_AOT_BLOCK_REUSE=0/1 from the environment.

    EMBER_LOGS=cudagraphs python benchmarks/probes/bert_block_reuse.py 90   # (seconds before a hang dumps stacks)
"""
import sys, os, time, faulthandler
sys.path.insert(0, "benchmarks")
faulthandler.dump_traceback_later(float(sys.argv[1]), exit=True)
import torch, gpu_suite as gs, ember
from ember.aot import blocks
torch.manual_seed(0)
build, inputs, nb = gs.make("bert_infer", "cuda", False)
ref = build(lambda f: f)(*inputs); torch.cuda.synchronize()
t = time.perf_counter()
step = build(lambda f: ember.compile(f))
out = step(*inputs); torch.cuda.synchronize()
t1 = time.perf_counter() - t
for _ in range(3): step(*inputs)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(100): step(*inputs)
torch.cuda.synchronize()
print(f"reuse={os.environ.get('EMBER_AOT_BLOCK_REUSE','1')} first {t1:.2f} s step {(time.perf_counter()-t)/100*1e3:.3f} ms err {(out.float()-ref.float()).abs().max().item():.3e} {dict(blocks.STATS)}", flush=True)
