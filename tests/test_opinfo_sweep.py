"""The OpInfo differential sweep (benchmarks/probes/opinfo_sweep.py) on a slice of op_db, module_db
and the square-shape patterns: no silent wrong result (mismatch), no crash, no timeout. Slow: the
whole sweep is a script (see its docstring); this runs a few minutes of it."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "probes", "opinfo_sweep.py")

SLICES = [
    ("ops", r"^(add|mul|sum|mean|var_mean|softmax|log_softmax|nn\.functional\.(layer_norm|rms_norm|group_norm|"
            r"batch_norm|cross_entropy|linear|gelu)|split_with_sizes_copy|unbind_copy|linalg\.(inv|solve|matrix_rank)|"
            r"max\.reduction_with_dim|index_put|scatter_add|cumsum|where|clamp)$"),
    ("modules", r"^nn\.(Linear|LayerNorm|RMSNorm|BatchNorm2d|GroupNorm|TransformerEncoderLayer|MultiheadAttention)$"),
    ("patterns", ""),
]


@pytest.mark.slow
@pytest.mark.parametrize("suite,ops", SLICES, ids=[s for s, _ in SLICES])
def test_sweep_slice(suite, ops, tmp_path):
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, SCRIPT, "--suite", suite, "--out", str(out), "--deadline", "900", "--max-samples", "2",
           "--cache-dir", str(tmp_path / "cache")]
    if ops:
        cmd += ["--ops", ops]
    subprocess.run(cmd, check=True, timeout=1200, cwd=ROOT)
    summary = json.loads(out.read_text())
    assert summary["samples"] > 0
    bad = summary["mismatch"] + summary["crash"] + summary["timeout"]
    assert not bad, json.dumps(bad, indent=1)[:4000]
