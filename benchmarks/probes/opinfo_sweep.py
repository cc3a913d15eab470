"""Differential sweep: PyTorch's OpInfo samples (``common_methods_invocations.op_db``) through
``ember.compile(fn, backend="ember")`` on CPU (the native backend's C++ renderer, the default)
against eager PyTorch.

Each op's first ``--max-samples`` samples run in several modes:

- ``infer``: inputs without grad (the inference graph);
- ``train``: inputs requiring grad where the op supports autograd (ember's training path: forward
  and backward graphs); outputs and every input's gradient (random cotangents) are compared;
- ``nc``: the sample made non-contiguous (``SampleInput.noncontiguous()``);
- ``t`` / ``x``: the primary input transposed (same values, column-major strides) / expanded (its
  first row broadcast over the others: stride 0);
- ``inplace``: the op's in-place variant on a graph input (the mutation must reach the caller);
- ``out``: the ``out=`` overload.

Every mode also compares the inputs after the call (a mutation ember forgot, or made up).

A result is ``pass``, ``graph_break`` (right numbers, but not one graph: a break, or a counted
eager fallback / ATen-run graph), ``mismatch`` (a wrong number, dtype or shape: the bug class this
sweep exists for), ``noise`` (outside the tolerance, but no farther from a float64 reference than
eager is: rounding order), ``error`` (ember raised where eager worked), ``crash`` (the worker
died: a segfault in generated code), ``timeout``, or ``skip`` (eager itself raised, or the op is
random / returns uninitialized memory).

Ops run in a worker process; a worker that dies is recorded as a crash of the sample it was on
and a new worker resumes after it. Results stream to ``<out>.jsonl``; the summary goes to ``<out>``.

usage: python benchmarks/probes/opinfo_sweep.py [--ops REGEX] [--dtypes float32,float64,...]
         [--modes infer,train,nc,t,x,inplace,out] [--max-samples 3] [--deadline 3000]
         [--out benchmarks/results/opinfo_sweep.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import types
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("infer", "train", "nc", "t", "x", "inplace", "out")

# random ops (eager and compiled draw different numbers) and ops whose result is uninitialized memory
SKIP_VALUES = re.compile(r"^(bernoulli|normal|uniform|multinomial|rand|randn|randint|rand_like|randn_like|"
                         r"randint_like|cauchy|exponential|geometric|log_normal|nn\.functional\.(.*dropout.*|rrelu)|"
                         r"empty|empty_like|empty_strided|empty_permuted|new_empty|new_empty_strided|resize_|resize_as_|"
                         r"nn\.functional\.multi_head_attention_forward|svd_lowrank|pca_lowrank|"
                         r"torch\.ops\.aten\._efficient_attention_forward|"
                         # its philox seed/offset outputs are uninitialized without dropout (CUDA, session 40)
                         r"torch\.ops\.aten\._flash_attention_forward)(\.|$)")
DTYPES = {"float32": "float32", "float64": "float64", "bfloat16": "bfloat16", "int64": "int64", "bool": "bool",
          "float16": "float16", "int32": "int32"}


def _default_tol():
    import torch
    return {torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1e-5, 1.6e-2),
            torch.float16: (1e-5, 1e-3)}


class _LazyTol(dict):
    def get(self, k, default=None):
        if not self:
            self.update(_default_tol())
        return super().get(k, default)


DEFAULT_TOL = _LazyTol()  # assert_close's defaults by dtype


def _stub_expecttest():
    """torch.testing._internal imports expecttest only for its TestCase base class; stub it if absent."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        m = types.ModuleType("expecttest")
        m.TestCase = unittest.TestCase
        sys.modules["expecttest"] = m


# ---------------------------------------------------------------------------- worker side

class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def _tolerance(op, dtype):
    """The largest (atol, rtol) any of the op's toleranceOverride decorators grants dtype, or None."""
    best = None
    for dec in getattr(op, "decorators", ()) or ():
        for d in getattr(dec, "decorators", (dec,)) or ():
            over = getattr(d, "d", None)
            if isinstance(over, dict) and dtype in over:
                t = over[dtype]  # toleranceOverride's tol(atol, rtol), or precisionOverride's atol
                atol, rtol = (t.atol, t.rtol) if hasattr(t, "atol") else (float(t), 0.0)
                best = (max(best[0], atol), max(best[1], rtol)) if best else (atol, rtol)
    if best is not None:  # an override widens assert_close's defaults, never narrows them
        d = DEFAULT_TOL.get(dtype)
        best = (max(best[0], d[0]), max(best[1], d[1])) if d else best
    return best


class Call:
    """A sample as a function of its tensors: ``fn(*tensors)`` calls the op with the sample's
    structure, the non-tensor arguments bound as constants (generated source, so ember traces a
    plain call, not pytree code)."""

    def __init__(self, callee, sample, *, out_arity=None):
        import torch
        self.tensors, names, consts = [], [], {}

        def spell(v):
            if isinstance(v, torch.Tensor):
                self.tensors.append(v)
                names.append(f"t{len(self.tensors) - 1}")
                return names[-1]
            if isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
                inner = ", ".join(spell(e) for e in v)
                return f"[{inner}]" if isinstance(v, list) else f"({inner},)"
            key = f"c{len(consts)}"
            consts[key] = v
            return key

        parts = [spell(sample.input)] + [spell(a) for a in sample.args]
        parts += [f"{k}={spell(v)}" for k, v in sample.kwargs.items()]
        self.n_in = len(self.tensors)
        params = [f"t{i}" for i in range(self.n_in)]
        if out_arity is not None:  # the out= tensors come last
            outs = [f"o{i}" for i in range(out_arity)]
            params += outs
            parts.append("out=" + (outs[0] if out_arity == 1 else f"({', '.join(outs)},)"))
        # an out= call's result is dropped, so a call kept only for its result shows as unwritten outs
        ret = "" if out_arity is not None else "return "
        src = f"def fn({', '.join(params)}):\n    {ret}callee({', '.join(parts)})\n"
        g = {"callee": callee, **consts}
        exec(compile(src, f"<opinfo {getattr(callee, '__name__', callee)}>", "exec"), g)
        self.fn, self.src = g["fn"], src


def _flat(x):
    import torch.utils._pytree as pytree
    return pytree.tree_flatten(x)[0]


def _clone(ts, grad=False):
    out = []
    for t in ts:
        c = t.detach().clone()
        if grad and t.requires_grad:
            c.requires_grad_(True)
        out.append(c)
    return out


def _check_close(a, e, dtype_tol):
    """None if a matches e (values, dtype, shape), else a short description."""
    import torch
    if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
        return f"type {type(a).__name__} != eager {type(e).__name__}"
    if not isinstance(e, torch.Tensor):
        if isinstance(e, float) and isinstance(a, float) and (e != e and a != a):
            return None
        return None if a == e else f"value {a!r} != eager {e!r}"
    if a.dtype != e.dtype:
        return f"dtype {a.dtype} != eager {e.dtype}"
    if a.shape != e.shape:
        return f"shape {tuple(a.shape)} != eager {tuple(e.shape)}"
    if e.is_complex() or e.is_quantized or e.layout != torch.strided:
        a, e = a.to_dense() if a.layout != torch.strided else a, e.to_dense() if e.layout != torch.strided else e
    kw = {}
    if dtype_tol and e.dtype.is_floating_point:
        kw = {"atol": dtype_tol[0], "rtol": dtype_tol[1]}
    try:
        torch.testing.assert_close(a.detach(), e.detach(), equal_nan=True, **kw)
    except AssertionError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        return " | ".join(lines[:4])[:400]
    return None


def _noise(a, e, r64):
    """True if a is no farther from the float64 reference than eager (times 3, plus a little)."""
    import torch
    if not (isinstance(a, torch.Tensor) and a.dtype.is_floating_point and isinstance(r64, torch.Tensor)):
        return False
    if r64.shape != a.shape:
        return False
    r = r64.detach().double()
    ea = (a.detach().double() - r).abs().nan_to_num(0)
    ee = (e.detach().double() - r).abs().nan_to_num(0)
    if ((a.isnan() != e.isnan()) | (a.isinf() & (a != e))).any():
        return False
    if not a.numel():
        return True
    # eager's own error (rounding order differs; x3 as inductor's fp64 comparison allows), plus the
    # dtype's epsilon-ish scaled by the tensor's largest value (a long sum's error grows with it)
    small = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}.get(a.dtype, 1e-7)
    return bool(ea.max() <= 3 * ee.max() + small * (1 + r.abs().nan_to_num(0).max()))


class Runner:
    def __init__(self, args, emit):
        import torch
        import ember
        from ember.diagnostics import counters
        from ember.testing import CompileCounterWithBackend
        self.torch, self.ember, self.counters = torch, ember, counters
        self.Counter = CompileCounterWithBackend
        self.args, self.emit = args, emit

    # one compiled call of call.fn on tensors; returns (outputs, frames, fallbacks, aten_graphs)
    def compiled(self, fn, tensors, kwargs=None):
        cc = self.Counter("ember")
        before, cbefore = self.counters.snapshot(), self.counters.compiled_snapshot()
        out = self.ember.compile(fn, backend=cc)(*tensors, **(kwargs or {}))
        fb = (self.counters.snapshot() - before)["eager_fallbacks"]
        compiled = self.counters.compiled_snapshot() - cbefore
        self.cpp_graphs = compiled["native_graphs.cpp"]
        return out, cc.frame_count, fb, compiled["native_graphs.aten"]

    def classify(self, op, dtype, got, want, ins_got, ins_want, grads, r64_fn):
        """The status and detail of a compiled result against eager."""
        torch = self.torch
        tol = _tolerance(op, dtype)
        pairs = list(zip(_flat(got), _flat(want), ["out"] * 10**6)) + list(zip(ins_got, ins_want, ["input"] * 10**6))
        if grads is not None:
            pairs += list(zip(grads[0], grads[1], ["grad"] * 10**6))
        nflat = (len(_flat(got)), len(_flat(want)))
        if nflat[0] != nflat[1]:
            return "mismatch", f"{nflat[0]} outputs != eager {nflat[1]}"
        bad, zeros_for_none = [], []
        for i, (a, e, what) in enumerate(pairs):
            if a is None and e is None:
                continue
            if (a is None) != (e is None):
                t = a if e is None else e
                if isinstance(t, torch.Tensor) and what == "grad" and not t.count_nonzero():
                    zeros_for_none.append(i)  # a zero gradient where eager has None: the same numbers
                    continue
                bad.append((i, what, f"{what} {'None' if a is None else 'a tensor'} where eager has "
                                     f"{'None' if e is None else 'a tensor'}"))
                continue
            why = _check_close(a, e, tol)
            if why:
                bad.append((i, what, f"{what}[{i}]: {why}"))
        if not bad:
            if zeros_for_none:
                return "noise", f"grad{zeros_for_none}: zeros where eager has None"
            return "pass", None
        # outside the tolerance: noise if no farther from a float64 reference than eager
        r64 = r64_fn() if r64_fn else None
        if r64 is not None:
            refs = _flat(r64[0]) + list(r64[1]) + (list(r64[2]) if grads is not None and len(r64) > 2 else [])
            if all(i < len(refs) and _noise(pairs[i][0], pairs[i][1], refs[i]) for i, _, _ in bad):
                return "noise", bad[0][2]
        return "mismatch", "; ".join(b[2] for b in bad[:2])

    def run_sample(self, op, sample, dtype, mode):
        torch = self.torch
        callee = op.op
        out_arity = None
        if mode == "inplace":
            callee = op.inplace_variant
        if mode in ("nc", "t", "x") and any(isinstance(t, torch.Tensor) and t.layout != torch.strided
                                           for t in _flat((sample.input, sample.args, sample.kwargs))):
            return None  # sparse samples have no layouts to vary
        if mode == "nc":
            sample = sample.noncontiguous()
        elif mode in ("t", "x"):
            x = sample.input
            if not (isinstance(x, torch.Tensor) and x.dim() >= 2 and x.numel() > 1):
                return None
            if mode == "t":
                x = x.detach().mT.contiguous().mT
            else:
                if x.shape[0] < 2:
                    return None
                x = x.detach()[:1].expand_as(x)
            sample = sample.__class__(x, args=sample.args, kwargs=sample.kwargs)
        grad = mode == "train"
        if mode == "out":
            try:
                ref = op.op(sample.input, *sample.args, **sample.kwargs)
            except Exception:
                return None
            refs = _flat(ref)
            if not refs or not all(isinstance(r, torch.Tensor) for r in refs):
                return None
            out_arity = len(refs) if isinstance(ref, (tuple, list)) else 1
            call = Call(callee, sample, out_arity=out_arity)
            outs = [torch.zeros_like(r) for r in refs]
        else:
            call = Call(callee, sample)
            outs = []
        tensors = call.tensors
        if grad and not any(t.requires_grad for t in tensors):
            return None

        # eager
        e_in = _clone(tensors, grad) + [o.clone() for o in outs]
        try:
            torch.manual_seed(0)
            want = call.fn(*e_in)
        except Exception as err:
            return ("skip", f"eager raised {type(err).__name__}: {str(err)[:120]}")
        values = not SKIP_VALUES.match(op.name)
        c_in = _clone(tensors, grad) + [o.clone() for o in outs]
        try:
            torch.manual_seed(0)
            got, frames, fb, aten = self.compiled(call.fn, c_in)
        except Timeout:
            raise
        except Exception as err:
            return ("error", f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
        if not values:
            return ("skip", "random or uninitialized values")

        grads = None
        used_cots = []
        if grad:
            proc = sample.output_process_fn_grad
            eo = [t for t in _flat(proc(want)) if isinstance(t, torch.Tensor) and t.requires_grad]
            co = [t for t in _flat(proc(got)) if isinstance(t, torch.Tensor)]
            co = [t for t, w in zip(co, [t for t in _flat(proc(want)) if isinstance(t, torch.Tensor)]) if w.requires_grad]
            leaves_e = [t for t in e_in if t.requires_grad]
            leaves_c = [t for t in c_in if t.requires_grad]
            if eo and len(co) == len(eo):
                torch.manual_seed(1)
                cots = [torch.randn_like(t) for t in eo]
                used_cots[:] = cots
                try:
                    ge = torch.autograd.grad(eo, leaves_e, cots, allow_unused=True)
                except Exception:
                    ge = None
                if ge is not None:
                    if not all(t.requires_grad for t in co):
                        return ("mismatch", "a compiled output does not require grad where eager's does")
                    try:
                        gc = torch.autograd.grad(co, leaves_c, cots, allow_unused=True)
                    except Exception as err:
                        return ("error", f"backward: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}")
                    grads = (list(gc), list(ge))

        def r64():
            if dtype not in (torch.float32, torch.bfloat16, torch.float16) or torch.float64 not in op.supported_dtypes(self.args.device):
                return None
            try:
                up = [t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t.detach().clone()
                      for t in (_clone(tensors, grad))] + [o.double() if o.is_floating_point() else o.clone() for o in outs]
                torch.manual_seed(0)
                r = call.fn(*up)
                res = [r, up[:call.n_in]]
                if grads is not None:
                    proc = sample.output_process_fn_grad
                    ro = [t for t in _flat(proc(r)) if isinstance(t, torch.Tensor) and t.requires_grad]
                    # eager's cotangents, upcast (a float64 draw would be other numbers)
                    cots = [c.to(t.dtype) for c, t in zip(used_cots, ro)]
                    leaves = [t for t in up if t.requires_grad]
                    res.append(list(torch.autograd.grad(ro, leaves, cots, allow_unused=True)))
                return res
            except Exception:
                return None

        status, detail = self.classify(op, dtype, got, want, c_in[:call.n_in] + c_in[call.n_in:],
                                       e_in[:call.n_in] + e_in[call.n_in:], grads, r64)
        if status == "pass" and (frames != 1 or fb or aten):
            status, detail = "graph_break", f"frames={frames} eager_fallbacks={fb} aten_graphs={aten}"
        return (status, detail)

    def run_op(self, op):
        torch = self.torch
        a = self.args
        for dname in a.dtypes:
            dtype = getattr(torch, dname)
            if dtype not in op.supported_dtypes(self.args.device):
                continue
            for mode in a.modes:
                if mode == "train" and not (op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)):
                    continue
                if mode == "inplace" and op.inplace_variant is None:
                    continue
                if mode == "out" and not op.supports_out:
                    continue
                if mode != "infer" and dname not in a.dtypes[:1] and mode != "train":
                    continue  # layout / variant modes only for the first dtype
                try:
                    torch.manual_seed(0)
                    samples = op.sample_inputs(a.device, dtype, requires_grad=(mode == "train"))
                    samples = _spread(list(samples), a.max_samples)
                except Exception as err:
                    self.emit({"op": _name(op), "dtype": dname, "mode": mode, "i": -1, "status": "skip",
                               "detail": f"sample_inputs raised {type(err).__name__}"})
                    continue
                for i, s in enumerate(samples):
                    self.run_one(op, s, dtype, mode, {"op": _name(op), "dtype": dname, "mode": mode, "i": i})

    def run_one(self, op, sample, dtype, mode, key, desc=None):
        self.guarded(key, lambda: self.run_sample(op, sample, dtype, mode), desc or _describe(sample))

    def guarded(self, key, thunk, desc):
        """Run thunk() -> (status, detail) or None under the per-sample timeout; emit the record."""
        self.emit({**key, "begin": True})
        t0 = time.time()
        self.cpp_graphs = None
        signal.alarm(self.args.sample_timeout)
        try:
            res = thunk()
        except Timeout:
            res = ("timeout", f"> {self.args.sample_timeout}s")
        except Exception as err:
            res = ("error", f"harness: {type(err).__name__}: {str(err)[:200]}")
        finally:
            signal.alarm(0)
        self.ember.reset()
        if res is None:
            self.emit({**key, "status": "n/a"})
            return
        self.emit({**key, "status": res[0], "detail": res[1], "s": round(time.time() - t0, 2), "cpp": self.cpp_graphs,
                   "sample": desc})


def _spread(samples, k):
    """k samples spread over the list (its first, last and evenly between): the first few of an
    OpInfo's samples are often its simplest."""
    if len(samples) <= k:
        return samples
    if k == 1:
        return samples[:1]
    return [samples[round(j * (len(samples) - 1) / (k - 1))] for j in range(k)]


def _name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _describe(s):
    import torch
    def d(v):
        if isinstance(v, torch.Tensor):
            nc = "" if v.layout != torch.strided or v.is_contiguous() else ",nc"
            return f"T{tuple(v.shape)}{str(v.dtype)[6:]}{nc}"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(d(e) for e in v) + "]"
        return repr(v)[:40]
    return f"{d(s.input)} args={d(list(s.args))} kw={ {k: d(v) for k, v in s.kwargs.items()} }"[:300]


def select_ops(args):
    _stub_expecttest()
    from torch.testing._internal.common_methods_invocations import op_db
    pat = re.compile(args.ops) if args.ops else None
    ops = [o for o in op_db if not pat or pat.search(_name(o))]
    if args.shard:
        k, n = map(int, args.shard.split("/"))
        ops = ops[k::n]
    return ops


def worker(args):
    sys.modules.setdefault("opinfo_sweep", sys.modules[__name__])  # one Timeout class for the extra suites
    signal.signal(signal.SIGALRM, _alarm)
    _stub_expecttest()
    done = set(args.skip_ops.split(",")) if args.skip_ops else set()
    with open(args.jsonl, "a") as f:
        def emit(rec):
            f.write(json.dumps(rec) + "\n")
            f.flush()
        runner = Runner(args, emit)
        runner.done = done
        if args.suite != "ops":
            import opinfo_sweep_extra as extra
            pat = re.compile(args.ops) if args.ops else None
            if args.suite == "modules":
                extra.run_modules(runner, emit, pat)
            else:
                extra.run_patterns(runner, emit, pat)
            return
        ops = select_ops(args)
        end = args.t_end
        for op in ops:
            if _name(op) in done:
                continue
            if time.time() > end:
                emit({"op": _name(op), "deadline": True})
                break
            emit({"op": _name(op), "op_begin": True})
            runner.run_op(op)
            emit({"op": _name(op), "op_end": True})


# ---------------------------------------------------------------------------- driver side

def _read(path):
    recs = []
    if os.path.exists(path):
        with open(path) as f:
            for ln in f:
                try:
                    recs.append(json.loads(ln))
                except ValueError:
                    pass
    return recs


def summarize(recs, wall):
    results = [r for r in recs if "status" in r and r["status"] != "n/a"]
    counts = collections.Counter(r["status"] for r in results)
    by_mode = collections.defaultdict(collections.Counter)
    for r in results:
        by_mode[r["mode"]][r["status"]] += 1
    ops = sorted({r["op"] for r in recs if r.get("op_end")})
    failing = collections.defaultdict(list)
    for r in results:
        if r["status"] in ("mismatch", "error", "crash", "timeout", "noise", "graph_break"):
            failing[r["status"]].append({k: r.get(k) for k in ("op", "dtype", "mode", "i", "detail", "sample")})
    return {"wall_s": round(wall, 1), "ops_done": len(ops), "samples": len(results), "counts": dict(counts),
            "by_mode": {m: dict(c) for m, c in by_mode.items()},
            "deadline_hit": any(r.get("deadline") for r in recs),
            "mismatch": failing["mismatch"], "crash": failing["crash"], "timeout": failing["timeout"],
            "error": failing["error"], "noise": failing["noise"], "graph_break": failing["graph_break"]}


def driver(args):
    t0 = time.time()
    t_end = t0 + args.deadline
    jsonl = args.out + "l" if args.out.endswith(".json") else args.out + ".jsonl"
    if os.path.exists(jsonl) and not args.resume:
        os.remove(jsonl)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cache = args.cache_dir or tempfile.mkdtemp(prefix="ember-opinfo-")
    env["EMBER_CACHE_DIR"] = cache
    env.setdefault("OMP_NUM_THREADS", "1")
    while True:
        recs = _read(jsonl)
        done = {r["op"] for r in recs if r.get("op_end")}
        if any(r.get("deadline") for r in recs) or time.time() > t_end:
            break
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--jsonl", jsonl, "--t-end", str(t_end),
               "--skip-ops", ",".join(sorted(done)), "--max-samples", str(args.max_samples),
               "--dtypes", ",".join(args.dtypes), "--modes", ",".join(args.modes),
               "--sample-timeout", str(args.sample_timeout), "--suite", args.suite, "--device", args.device]
        if args.ops:
            cmd += ["--ops", args.ops]
        if args.shard:
            cmd += ["--shard", args.shard]
        rc = subprocess.call(cmd, env=env)
        if rc == 0:
            break
        # the worker died: the sample it had begun crashed; mark its op done and go on
        recs = _read(jsonl)
        begun = [r for r in recs if r.get("begin")]
        last = begun[-1] if begun else None
        with open(jsonl, "a") as f:
            if last is not None:
                f.write(json.dumps({**{k: last[k] for k in ("op", "dtype", "mode", "i")}, "status": "crash",
                                    "detail": f"worker exited with {rc}"}) + "\n")
                f.write(json.dumps({"op": last["op"], "op_end": True}) + "\n")
            else:
                break
    summary = summarize(_read(jsonl), time.time() - t0)
    summary["command"] = " ".join(sys.argv)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in ("wall_s", "ops_done", "samples", "counts", "by_mode", "deadline_hit")},
                     indent=1))
    for st in ("mismatch", "crash", "error", "timeout"):
        for r in summary[st]:
            print(f"{st:9} {r['op']:40} {r['dtype']:9} {r['mode']:7} {r['i']} {r['detail']}  {r.get('sample') or ''}"[:400])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="ops", choices=("ops", "modules", "patterns"),
                   help="ops: op_db samples; modules: module_db; patterns: composite ops at square shapes")
    p.add_argument("--ops", default="", help="regex on op (module, pattern) names")
    p.add_argument("--dtypes", default="float32", help="comma list; layout modes use the first")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--max-samples", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu (C++ renderer, or Triton under EMBER_NATIVE_FORCE_TRITON=1 "
                   "TRITON_INTERPRET=1) or cuda (the Triton kernels on a GPU)")
    p.add_argument("--deadline", type=float, default=3000, help="seconds for the whole sweep")
    p.add_argument("--sample-timeout", type=int, default=120)
    p.add_argument("--shard", default="", help="k/n: every n-th op from the k-th")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "opinfo_sweep.json"))
    p.add_argument("--cache-dir", default="", help="ember cache (default: a fresh temporary directory)")
    p.add_argument("--resume", action="store_true", help="keep <out>l and skip the ops it finished")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--jsonl", help=argparse.SUPPRESS)
    p.add_argument("--t-end", type=float, help=argparse.SUPPRESS)
    p.add_argument("--skip-ops", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dtypes = [DTYPES[d] for d in args.dtypes.split(",") if d]
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        p.error(f"unknown modes {bad}; valid: {', '.join(MODES)}")
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
