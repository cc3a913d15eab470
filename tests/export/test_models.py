"""Acceptance: export -> torch.export.save -> torch.export.load in a fresh process -> .module()(...)
equals eager, for a dynamic batch across 3 sizes with no re-export; the same models as AOT packages
(aot_compile -> aot_load in a fresh process that never imports ember's frontend)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ember.export as ee
from tests.export.models import HAS, NEEDS, build
from tests.export.test_aot import HEAVY

REPO = Path(__file__).resolve().parents[2]
BATCHES = (2, 3, 5)

CHILD = textwrap.dedent("""
    import sys, torch
    if sys.argv[3] != "None":
        __import__(sys.argv[3])  # registers the model's output classes with pytree, as torch.export needs
    inputs, expected = torch.load(sys.argv[1])
    ep = torch.export.load(sys.argv[2])          # no model code in this process
    module = ep.module()
    for args, want in zip(inputs, expected):
        got = module(*args)
        got = got.last_hidden_state if hasattr(got, "last_hidden_state") else got
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    print("pt2 ok", len(inputs))
""")

CHILD_AOT = textwrap.dedent("""
    import sys, torch
    from ember.export.aot_runtime import aot_load
    if sys.argv[3] != "None":
        __import__(sys.argv[3])
    inputs, expected = torch.load(sys.argv[1])
    run = aot_load(sys.argv[2])
    for args, want in zip(inputs, expected):
        got = run(*args)
        got = got.last_hidden_state if hasattr(got, "last_hidden_state") else got
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    heavy = sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[4].split(","))))
    assert not heavy, heavy
    print("aot ok", len(inputs), type(run._run).__name__, run.manifest.get("native", {}).get("renderer"))
""")


def run_child(script: str, *argv) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", script, *map(str, argv)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _output_module(need):
    # transformers' ModelOutput classes register with pytree when their module is imported
    return "transformers.modeling_outputs" if need == "transformers" else None


@pytest.mark.parametrize("name", list(NEEDS))
def test_export_round_trip_fresh_process(name, tmp_path):
    need = NEEDS[name]
    if need and not HAS[need]:
        pytest.skip(f"{need} is not installed")
    model, make_args, pick = build(name)
    example = make_args(BATCHES[0])
    first = "input_ids" if need == "transformers" else "x"
    ep = ee.export(model, example, dynamic_shapes={first: {0: ee.Dim("batch", max=8)}})
    assert len(ep.range_constraints) >= 1
    inputs = [make_args(b) for b in BATCHES]
    with torch.no_grad():
        expected = [pick(model(*a)) for a in inputs]
    torch.save((inputs, expected), tmp_path / "io.pt")
    ee.save(ep, tmp_path / "m.pt2")
    assert "pt2 ok 3" in run_child(CHILD, tmp_path / "io.pt", tmp_path / "m.pt2", _output_module(need))
    ee.aot_compile(ep, str(tmp_path / "m.ember"), device="cpu")
    out = run_child(CHILD_AOT, tmp_path / "io.pt", tmp_path / "m.ember", _output_module(need), ",".join(HEAVY))
    # the C++ renderer's kernels where a compiler works (else the ATen wrapper, with a warning)
    from ember.native import cpp_build
    assert ("aot ok 3 function cpp" if cpp_build.problem() is None else "aot ok 3") in out, out
