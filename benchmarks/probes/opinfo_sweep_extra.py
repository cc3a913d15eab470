"""The sweep's two other suites (see opinfo_sweep.py):

- ``modules``: PyTorch's ``common_modules.module_db`` (nn.Linear ... nn.TransformerDecoderLayer), each
  ModuleInput compiled as a module, in training (outputs, input and parameter gradients, buffers
  after the call: BatchNorm's running statistics) and eval (outputs);
- ``patterns``: composite ops and short chains whose fused backward mixes row and column reductions
  (norms, softmax, losses, Linear), at shapes where rows == hidden, rows == 1, hidden == 1 and
  rows > / < hidden: the class of session 38's silent wrong gradient (a [64, 64] RMSNorm backward),
  which single-op samples rarely reach.
"""
from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

import opinfo_sweep as S


# ---------------------------------------------------------------------------- patterns

def _ln(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def _rms(x, w):
    return F.rms_norm(x, x.shape[-1:], w, eps=1e-6)


def _ln_gelu_linear(x, w, b, lw, lb):
    return F.linear(F.gelu(F.layer_norm(x, x.shape[-1:], w, b)), lw, lb)


def _rms_res(x, r, w):
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w, eps=1e-6) * h.sigmoid()


def _softmax_mm(x, w):
    return torch.softmax(x @ w, -1) @ w.t()


def _ce(x, w, t):
    return F.cross_entropy(x @ w, t)


def _bn(x, w, b):
    return F.batch_norm(x, None, None, w, b, training=True)


def _gn(x, w, b):
    return F.group_norm(x, 2, w, b)


def _col_row(x, w):
    # a row reduction and a column reduction of the same tensor feeding one output
    y = x * w
    return y - y.mean(-1, keepdim=True) + y.sum(0, keepdim=True) / y.shape[0]


def _log_softmax_t(x):
    return F.log_softmax(x.t(), -1).t() * 2


def _mse_linear(x, w, y):
    return F.mse_loss(F.linear(x, w), y)


def _ln_no_affine_sum(x):
    return F.layer_norm(x, x.shape[-1:]).pow(2).sum(0)


# name -> (fn, input builder (R rows, H hidden) -> tensors; floating ones require grad)
PATTERNS = {
    "layer_norm": (_ln, lambda R, H: [(R, H), (H,), (H,)]),
    "rms_norm": (_rms, lambda R, H: [(R, H), (H,)]),
    "rms_norm_3d": (_rms, lambda R, H: [(2, R, H), (H,)]),
    "ln_gelu_linear": (_ln_gelu_linear, lambda R, H: [(R, H), (H,), (H,), (H, H), (H,)]),
    "rms_residual": (_rms_res, lambda R, H: [(R, H), (R, H), (H,)]),
    "softmax_mm": (_softmax_mm, lambda R, H: [(R, H), (H, H)]),
    "cross_entropy": (_ce, lambda R, H: [(R, H), (H, H), ("target", R, H)]),
    "batch_norm_train": (_bn, lambda R, H: [(R, H), (H,), (H,)]),
    "group_norm": (_gn, lambda R, H: [(R, 2 * H, 3), (2 * H,), (2 * H,)]),
    "col_row": (_col_row, lambda R, H: [(R, H), (H,)]),
    "log_softmax_t": (_log_softmax_t, lambda R, H: [(R, H)]),
    "mse_linear": (_mse_linear, lambda R, H: [(R, H), (H, H), ("const", R, H)]),
    "ln_no_affine_sum": (_ln_no_affine_sum, lambda R, H: [(R, H)]),
}
SHAPES = [(16, 16), (64, 64), (1, 16), (16, 1), (48, 16), (16, 48), (33, 33), (128, 8), (8, 128)]


def _make(spec, dtype, device):
    if spec[0] == "target":
        return torch.randint(0, spec[2], (spec[1],)).to(device)
    if spec[0] == "const":
        return torch.randn(spec[1:]).to(device, dtype)
    return torch.randn(spec).to(device, dtype).requires_grad_(True)


class Sample:
    """Enough of an OpInfo SampleInput for Runner.run_sample's train path."""

    def __init__(self, tensors):
        self.input, self.args, self.kwargs = tensors[0], tuple(tensors[1:]), {}

    def output_process_fn_grad(self, x):
        return x


class PatternOp:
    """A pattern as an OpInfo for Runner.run_sample: op, name, supported dtypes."""
    variant_test_name = ""
    inplace_variant = None
    decorators = ()

    def __init__(self, name, fn):
        self.name, self.op = "pattern." + name, fn

    def supported_dtypes(self, device):
        return {torch.float32, torch.float64, torch.bfloat16}


def run_patterns(runner, emit, names=None):
    for name, (fn, build) in PATTERNS.items():
        if names and not names.search(name):
            continue
        op = PatternOp(name, fn)
        emit({"op": op.name, "op_begin": True})
        for dname in runner.args.dtypes:
            dtype = getattr(torch, dname)
            if not dtype.is_floating_point:
                continue
            for i, (R, H) in enumerate(SHAPES):
                torch.manual_seed(i)
                sample = Sample([_make(s, dtype, runner.args.device) for s in build(R, H)])
                for mode in ("train", "infer"):
                    if mode == "infer":
                        sample = Sample([t.detach() for t in [sample.input, *sample.args]])
                    runner.run_one(op, sample, dtype, mode, {"op": op.name, "dtype": dname, "mode": mode, "i": i},
                                   f"R={R} H={H}")
        emit({"op": op.name, "op_end": True})


# ---------------------------------------------------------------------------- modules

def _tensors(x):
    return [t for t in S._flat(x) if isinstance(t, torch.Tensor)]


def run_module_input(runner, mi, minput, dtype, training):
    """(status, detail) of one ModuleInput against eager."""
    ci, fi = minput.constructor_input, minput.forward_input
    torch.manual_seed(0)
    try:
        m_e = mi.module_cls(*ci.args, **ci.kwargs).to(dtype)
    except Exception as err:
        return ("skip", f"constructor raised {type(err).__name__}")
    m_e.train(training)
    m_c = copy.deepcopy(m_e)
    args_e = [S._clone([a], True)[0] if isinstance(a, torch.Tensor) else a for a in fi.args]
    args_c = [S._clone([a], True)[0] if isinstance(a, torch.Tensor) else a for a in fi.args]
    try:
        torch.manual_seed(0)
        want = m_e(*args_e, **fi.kwargs)
    except Exception as err:
        return ("skip", f"eager raised {type(err).__name__}: {str(err)[:100]}")
    try:
        torch.manual_seed(0)
        got, frames, fb, aten = runner.compiled(m_c, args_c, kwargs=fi.kwargs)
    except S.Timeout:
        raise
    except Exception as err:
        return ("error", f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
    if any(k in mi.name for k in ("Dropout", "Fractional", "RReLU")):
        return ("skip", "random values")
    grads = None
    leaves_e = [a for a in args_e if isinstance(a, torch.Tensor) and a.requires_grad] + list(m_e.parameters())
    leaves_c = [a for a in args_c if isinstance(a, torch.Tensor) and a.requires_grad] + list(m_c.parameters())
    eo = [t for t in _tensors(want) if t.requires_grad]
    co = [t for t, w in zip(_tensors(got), _tensors(want)) if w.requires_grad]
    if training and eo and leaves_e and len(co) == len(eo):
        torch.manual_seed(1)
        cots = [torch.randn_like(t) for t in eo]
        ge = torch.autograd.grad(eo, leaves_e, cots, allow_unused=True)
        if not all(t.requires_grad for t in co):
            return ("mismatch", "a compiled output does not require grad where eager's does")
        try:
            gc = torch.autograd.grad(co, leaves_c, cots, allow_unused=True)
        except Exception as err:
            return ("error", f"backward: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}")
        grads = (list(gc), list(ge))
    ins_c = [a for a in args_c if isinstance(a, torch.Tensor)] + list(m_c.buffers())
    ins_e = [a for a in args_e if isinstance(a, torch.Tensor)] + list(m_e.buffers())
    status, detail = runner.classify(None, dtype, got, want, ins_c, ins_e, grads, None)
    if status == "pass" and (frames != 1 or fb or aten):
        status, detail = "graph_break", f"frames={frames} eager_fallbacks={fb} aten_graphs={aten}"
    return (status, detail)


def run_modules(runner, emit, pat=None):
    from torch.testing._internal.common_modules import module_db
    for mi in module_db:
        if pat and not pat.search(mi.name):
            continue
        if mi.name in runner.done:
            continue
        if time.time() > runner.args.t_end:
            emit({"op": mi.name, "deadline": True})
            break
        emit({"op": mi.name, "op_begin": True})
        for dname in runner.args.dtypes:
            dtype = getattr(torch, dname)
            if not dtype.is_floating_point or dtype not in mi.supported_dtypes(runner.args.device):
                continue
            for training in (True, False):
                mode = "train" if training else "infer"
                try:
                    torch.manual_seed(0)
                    inputs = mi.module_inputs_func(mi, device=runner.args.device, dtype=dtype, requires_grad=training,
                                                   training=training)
                except Exception as err:
                    emit({"op": mi.name, "dtype": dname, "mode": mode, "i": -1, "status": "skip",
                          "detail": f"module_inputs_func raised {type(err).__name__}"})
                    continue
                for i, minput in enumerate(S._spread(list(inputs), runner.args.max_samples)):
                    key = {"op": mi.name, "dtype": dname, "mode": mode, "i": i}
                    runner.guarded(key, lambda: run_module_input(runner, mi, minput, dtype, training),
                                   getattr(minput, "desc", ""))
        emit({"op": mi.name, "op_end": True})
