"""Every case of the op table, compiled to Triton and compared with eager (see harness.py)."""
import pytest
import torch

pytest.importorskip("triton")

from tests.native.harness import DEVICE, run_case  # noqa: E402
from tests.native.optable import OPS, f32  # noqa: E402

# tiny blocks: several programs per launch and several iterations of each reduction loop
SMALL_BLOCKS = {"max_xblock": 8, "max_rblock": 8}

PARAMS = [pytest.param(c, dt, {}, id=f"{c.name}-{str(dt).replace('torch.', '')}") for c in OPS for dt in c.dtypes]
PARAMS += [pytest.param(c, f32, SMALL_BLOCKS, id=f"{c.name}-looped") for c in OPS if c.looped]


@pytest.mark.parametrize("case,dtype,options", PARAMS)
def test_op(case, dtype, options, native_cache):
    torch.manual_seed(0)
    inputs = case.make(dtype, DEVICE)
    tol = {"atol": case.atol, "rtol": case.rtol} if dtype == f32 else {}
    compiled = run_case(case.fn, inputs, options=options, cache_dir=native_cache, check_strides=case.strides, **tol)
    report = compiled.ember_native["report"]
    if case.kernels is not None and not options:
        assert report["kernels"] == case.kernels, report
    if case.externs is not None:
        assert report["externs"] == case.externs, report
