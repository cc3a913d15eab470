"""Dump the Triton source the native backend generates for a fixed set of graphs, and time
lowering + emission: the check that a refactoring of the code generator (the op registry,
``ember/native/ops.py``) leaves every kernel byte-identical and compile time no worse.

    python benchmarks/probes/kernel_dump.py dump /tmp/before.txt   # every op-table case + models
    python benchmarks/probes/kernel_dump.py time                   # lowering+emission CPU time
    diff /tmp/before.txt /tmp/after.txt

Nothing runs: graphs are traced (make_fx + DECOMPOSITIONS, fake tensors) and planned only
(``backend.plan``: lower, verify, schedule, emit), so this is quick on a CPU.
"""
import gc
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ember.native.backend import DEFAULT_OPTIONS, plan  # noqa: E402
from tests.native.harness import trace  # noqa: E402
from tests.native.optable import OPS  # noqa: E402


def chain(x, y):
    """A long pointwise chain touching most unary/binary ops (one big fused kernel)."""
    for i in range(12):
        x = torch.sigmoid(x) * torch.tanh(y) + torch.erf(x * 0.5) - torch.exp(-x.abs())
        y = torch.maximum(x, y) / (1.5 + torch.cos(x)) + torch.log1p(y.abs()) * torch.rsqrt(1 + y * y)
        x = torch.where(x > y, x.atan(), torch.floor(y * 3) / 3) + torch.pow(y.abs() + 1, 1.3)
    return x + y, (x > 0).sum(1)


def mlp_train(x, w1, b1, w2):
    """Forward and backward (gelu, layer norm, softmax cross entropy): the backward graphs' ops."""
    def loss(w1, w2):
        h = F.gelu(F.layer_norm(x @ w1 + b1, (w1.shape[1],)))
        return F.cross_entropy(torch.tanh(h) @ w2, torch.arange(x.shape[0]) % w2.shape[1])
    grads, value = torch.func.grad_and_value(loss, argnums=(0, 1))(w1, w2)
    return (value,) + grads


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                   attn_implementation="eager")).eval()
    ids = torch.randint(0, 128, (2, 24))
    params = dict(m.named_parameters())

    def fwd(ids, *ps):
        return torch.func.functional_call(m, dict(zip(params, ps)), (ids,)).logits
    return fwd, [ids] + [p.detach() for p in params.values()]


def graphs():
    torch.manual_seed(0)
    for c in OPS:
        for dt in c.dtypes:
            yield f"{c.name}-{dt}", c.fn, c.make(dt, "cpu"), "fake"
    for name in ("add_bcast", "sum_d0", "softmax", "layer_norm", "cat", "where", "pow_frac", "int_arith"):
        c = next(c for c in OPS if c.name == name)
        yield f"{name}-symbolic", c.fn, c.make(torch.float32, "cpu"), "symbolic"
    yield "chain", chain, [torch.randn(33, 65), torch.randn(33, 65)], "fake"
    for dt in (torch.float32, torch.bfloat16):
        yield f"mlp_train-{dt}", mlp_train, [torch.randn(13, 24, dtype=dt), torch.randn(24, 19, dtype=dt),
                                              torch.randn(19, dtype=dt), torch.randn(19, 7, dtype=dt)], "fake"
    f64 = torch.rand(9, 31, dtype=torch.float64) + 0.5
    yield "float64", lambda x: (1 / x, x.reciprocal(), x ** -2, torch.rsqrt(x), torch.erf(x)), [f64], "fake"
    yield "chain-float64", chain, [f64, f64 * 2], "fake"
    fwd, inputs = gpt2()
    yield "gpt2", fwd, inputs, "fake"


def kernels(fn, inputs, mode):
    gm = trace(fn, inputs, mode)
    _, _, _, emitted = plan(gm, inputs, dict(DEFAULT_OPTIONS))
    return [f"# {ek.kind} {ek.config} args={ek.args}\n{ek.source}" for _, ek in emitted]


def dump(path):
    with open(path, "w") as f:
        for name, fn, inputs, mode in graphs():
            try:
                srcs = kernels(fn, inputs, mode)
            except Exception as e:  # noqa: BLE001 - a case that does not plan is recorded as such
                srcs = [f"ERROR {type(e).__name__}: {e}"]
            f.write(f"==== {name}\n" + "\n".join(srcs) + "\n")
    print("wrote", path)


def timing(repeats=21):
    """CPU time of the process (the machine may be shared: wall time is noisier), min and median."""
    cases = {"chain": (chain, [torch.randn(33, 65), torch.randn(33, 65)]), "gpt2": gpt2()}
    for name, (fn, inputs) in cases.items():
        times = []
        for _ in range(repeats):
            gm = trace(fn, inputs, "fake")
            gc.collect()
            t = time.process_time()
            plan(gm, inputs, dict(DEFAULT_OPTIONS))
            times.append(time.process_time() - t)
        print(f"{name}: lower+verify+schedule+emit CPU time min {min(times) * 1e3:.1f} ms, "
              f"median {statistics.median(times) * 1e3:.1f} ms ({repeats} runs)")


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        timing()
