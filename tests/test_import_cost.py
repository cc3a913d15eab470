"""``import ember`` and decorating with ``ember.compile`` load no frontend, autograd layer or kernels
(issue 29): those load at the first call of a compiled function."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("ember.frontend.interpreter", "ember.frontend.cache", "ember.aot", "ember.native", "triton", "sympy")

SCRIPT = f"""
import json, sys
import torch
import ember

@ember.compile
def f(x):
    return x + 1

g = ember.compile(torch.nn.Linear(2, 2), backend="aot_eager", mode=None)
h = ember.compile(backend="eager")(lambda x: x * 2)
loaded_after_decoration = [m for m in {HEAVY!r} if m in sys.modules]
x = torch.ones(2)
assert f(x).tolist() == [2.0, 2.0]
loaded_after_call = [m for m in {HEAVY!r}[:3] if m in sys.modules]
print(json.dumps([loaded_after_decoration, loaded_after_call]))
"""


def test_import_and_decoration_load_no_heavy_module():
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    after_decoration, after_call = json.loads(out.stdout.strip().splitlines()[-1])
    import torch

    # with a GPU, the default backend starts Triton's own start-up work at decoration (its prewarm),
    # on purpose (issue 29: Triton's start-up begins early when a GPU is present)
    allowed = {"ember.native", "triton"} if torch.cuda.is_available() else set()
    unexpected = [m for m in after_decoration if m not in allowed]
    assert unexpected == [], f"loaded by import ember + ember.compile(...): {unexpected}"
    assert after_call == list(HEAVY[:3]), "the first call loads the frontend and the autograd layer"


def test_lazy_names_resolve_and_unknown_names_raise():
    import ember
    assert callable(ember.mark_dynamic) and callable(ember.disable) and issubclass(ember.Unsupported, Exception)
    assert set(ember.__all__) <= set(dir(ember))
    try:
        ember.no_such_name
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("ember.no_such_name did not raise")
