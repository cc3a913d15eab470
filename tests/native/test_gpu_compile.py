"""Generated kernels must compile for a real GPU, not only run in the interpreter: compile them for
sm_90 offline in a subprocess without TRITON_INTERPRET (see gpu_compile_check.py)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))
FUSED = "softmax,log_softmax,layer_norm,rms_norm,cross_entropy,gelu_linear,argmax,any_all,tanh,pow_frac,cat"


def _check(cases: str, *flags):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, os.path.join(HERE, "gpu_compile_check.py"), cases, *flags], env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["kernels"] > 0 and res["failures"] == [], res
    return res


def test_fused_patterns_compile_for_sm90():
    _check(FUSED)


@pytest.mark.slow
def test_every_op_table_kernel_compiles_for_sm90():
    _check("")


def test_symbolic_fused_patterns_compile_for_sm90():
    """Dynamic shapes: sizes are run-time arguments and looped reductions loop over a run-time
    rnumel (the interpreter runs those loops with a constexpr bound, so only this checks them)."""
    _check(FUSED, "--symbolic")


@pytest.mark.slow
def test_every_symbolic_op_table_kernel_compiles_for_sm90():
    _check("", "--symbolic")
