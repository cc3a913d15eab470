"""The persisted frontend cache (ember/frontend/persist.py), in fresh processes: a cold process stores
its entries, a warm one installs them without tracing (counted: ``frames_compiled`` stays 0,
``frames_loaded`` counts installs), with outputs and gradients equal to the cold run's and to eager.
Anything that could change the result makes the warm process trace again: a changed global, a
changed closure value, a monkey-patched method, other input shapes (the stored guards reject them),
a tampered entry (one log line), or the option turned off."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent('''
    import json, os, sys
    import torch
    import ember
    from ember.diagnostics import counters

    K = float(os.environ.get("K", "3.0"))
    C = float(os.environ.get("C", "2.0"))

    def make(c):
        def scale(t):
            return t * c
        return scale

    scale = make(C)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.lin(x)) * K + scale(x).sin()

    if os.environ.get("PATCH"):
        def other(self, x):
            return torch.tanh(self.lin(x)) * K + scale(x).sin()
        Block.forward = other

    torch.manual_seed(0)
    dev = os.environ.get("DEV", "cpu")
    model = torch.nn.Sequential(Block(), torch.nn.Linear(8, 4)).to(dev)
    n = int(os.environ.get("N", "4"))
    x = torch.randn(n, 8).to(dev)
    compiled = ember.compile(model, backend=os.environ.get("BACKEND", "aot_eager"))
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(x)
    ref.sum().backward()
    ok = torch.allclose(out, ref, atol=1e-5) and all(
        torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, model.parameters()))
    print(json.dumps({"ok": bool(ok), "sum": float(out.sum()), "compiled": counters.COMPILES["frames_compiled"],
                      "loaded": counters.COMPILES["frames_loaded"]}))
''')


@pytest.fixture
def run(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cache = tmp_path / "cache"

    def go(**env):
        e = dict(os.environ, EMBER_CACHE_DIR=str(cache), PYTHONPATH=REPO, **{k: str(v) for k, v in env.items()})
        e.pop("EMBER_FRONTEND_CACHE", None) if "EMBER_FRONTEND_CACHE" not in env else None
        p = subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        got = json.loads(p.stdout.strip().splitlines()[-1])
        got["stderr"] = p.stderr
        return got
    go.cache = cache
    return go


def test_warm_process_installs_without_tracing(run):
    cold = run()
    assert cold["ok"] and cold["compiled"] == 1 and cold["loaded"] == 0
    warm = run()
    assert warm["ok"], "the installed entry's outputs or gradients differ from eager"
    assert warm["compiled"] == 0 and warm["loaded"] == 1, warm
    assert warm["sum"] == cold["sum"]


def test_changed_global_or_closure_or_method_traces_again(run):
    assert run()["compiled"] == 1
    for env in ({"K": 5.0}, {"C": 7.0}, {"PATCH": 1}):
        got = run(**env)
        assert got["ok"], env
        assert got["compiled"] == 1 and got["loaded"] == 0, (env, got)


def test_guard_failure_compiles(run):
    assert run(N=4)["compiled"] == 1
    got = run(N=6)  # the stored entry's shape guard rejects the call
    assert got["ok"] and got["compiled"] == 1 and got["loaded"] == 0
    got = run(N=6)  # both entries stored under the key now: the second one fits
    assert got["ok"] and got["compiled"] == 0 and got["loaded"] == 1


def test_tampered_entry_is_rejected_with_one_line(run):
    assert run()["compiled"] == 1
    files = [os.path.join(d, f) for d, _, fs in os.walk(run.cache / "frontend") for f in fs]
    assert len(files) == 1
    data = bytearray(open(files[0], "rb").read())
    data[-10] ^= 0xFF
    with open(files[0], "wb") as f:
        f.write(data)
    got = run()
    assert got["ok"] and got["compiled"] == 1 and got["loaded"] == 0
    lines = [ln for ln in got["stderr"].splitlines() if "frontend entry" in ln]
    assert len(lines) == 1 and "checksum" in lines[0], got["stderr"][-2000:]
    assert run()["loaded"] == 1  # replaced by the recompile


def test_option_off(run):
    assert run(EMBER_FRONTEND_CACHE=0)["compiled"] == 1
    assert not (run.cache / "frontend").exists()
    got = run(EMBER_FRONTEND_CACHE=0)
    assert got["compiled"] == 1 and got["loaded"] == 0


def test_default_backend_cpu(run):
    """The whole path: the native backend's C++ kernels, from its own cache in the warm process."""
    cold = run(BACKEND="ember")
    warm = run(BACKEND="ember")
    assert cold["ok"] and warm["ok"] and warm["compiled"] == 0 and warm["loaded"] == 1


@pytest.mark.gpu
def test_default_backend_cuda(run):
    """On a GPU: the Triton kernels and wrapper from the native backend's cache, the entry from ours."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    cold = run(BACKEND="ember", DEV="cuda")
    warm = run(BACKEND="ember", DEV="cuda")
    assert cold["ok"] and warm["ok"] and warm["compiled"] == 0 and warm["loaded"] == 1
    assert warm["sum"] == cold["sum"]


def test_an_installs_expressions_come_compiled_from_the_store(tmp_path, monkeypatch):
    """The expressions an install evaluates (guard sources re-finding objects, the graph's inputs) are
    kept per record as code objects, each under its exact text: a warm process evaluates them
    without compiling; a tampered store is ignored (they compile, same values)."""
    import builtins

    from ember.config import config
    from ember.frontend import persist
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(persist, "_EXPR_CODE", {})
    record = {"inputs": ["args[0]", "self['w'] + 1"], "funcs": [("at", "self['f']", None, None)],
              "ns": {"a": ("lit", 1), "b": ("at", "args[1] * 2", None, None)}}
    persist._store_exprs(record)
    monkeypatch.setattr(persist, "_EXPR_CODE", {})  # (a later process)
    compiled = []
    real = builtins.compile
    monkeypatch.setattr(builtins, "compile", lambda *a, **k: compiled.append(a[0]) or real(*a, **k))
    persist._load_exprs(record)
    assert sorted(persist._EXPR_CODE) == sorted(["args[0]", "self['w'] + 1", "self['f']", "args[1] * 2"])
    local = {"args": (5, 7), "self": {"w": 2, "f": "F"}}
    got = [eval(persist._expr_code(e), {}, dict(local)) for e in persist._exprs_of(record)]  # noqa: S307
    assert got == [5, 3, 14, "F"] and compiled == []
    path, _ = persist._exprs_path(record)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-1] + bytes([data[-1] ^ 1]))
    monkeypatch.setattr(persist, "_EXPR_CODE", {})
    persist._load_exprs(record)
    assert persist._EXPR_CODE == {}
    assert [eval(persist._expr_code(e), {}, dict(local)) for e in persist._exprs_of(record)] == got  # noqa: S307
    assert len(compiled) == 4
