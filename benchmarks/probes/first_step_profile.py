"""Where does the warm first step's time go? An eager twin step, then ember's first and second step, profiled (CPU).

    EMBER_CACHE_DIR=/tmp/ec python benchmarks/probes/first_step_profile.py cold; then the same with warm
    Results: benchmarks/results/gpt2_train-first-step-h100-s41.txt
"""
import json, sys, time
sys.path.insert(0, "benchmarks")
import torch, torch._dynamo  # noqa
from torch.profiler import profile, ProfilerActivity
from gpu_suite import make, compiler_fn
torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True
tag = sys.argv[1]
torch.manual_seed(0)
build, inputs, _ = make("gpt2_train", "cuda", False)
tb, ti, _ = make("gpt2_train", "cuda", False)
eager = tb(lambda f: f)

def prof(fn, args, label):
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        fn(*args); torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    ev = [e for e in p.events() if "cudnn_attention" in e.name or "flash_attention" in e.name or "efficient_attention" in e.name]
    top = sorted(((e.key, round(e.cpu_time_total / 1e3, 2)) for e in p.key_averages()), key=lambda x: -x[1])[:12]
    print(label, "wall", round(wall, 3), flush=True)
    for e in ev[:6] + ev[-3:]:
        print("   ", e.name, round(e.cpu_time_total / 1e3, 2), "ms", str(e.input_shapes)[:160], flush=True)
    print("    top:", top, flush=True)

prof(eager, ti, "eager step 1")
prof(eager, ti, "eager step 2")
step = build(compiler_fn("ember", "default"))
prof(step, inputs, f"ember {tag} step 1")
prof(step, inputs, f"ember {tag} step 2")
