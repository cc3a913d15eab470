"""benchmarks/compile_time.py runs end to end in --quick mode on a CPU (tiny shapes): cold and warm
processes per row, the warm ember process installing its entry from the frontend cache (no trace),
and the dynamic sweep counting compiles. No timing is asserted."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_cpu_run(tmp_path):
    out = tmp_path / "ct.json"
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "compile_time.py"), "--device", "cpu",
                        "--quick", "--workloads", "mlp,dynamic", "--compilers", "ember", "--out", str(out)],
                       capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(out.read_text())
    rows = {(r.get("row"), r.get("compiler"), r.get("phase")): r for r in res["rows"]}
    assert rows[("import", None, None)]["import_ember_beyond_torch_s"] >= 0
    cold, warm = rows[("mlp", "ember", "cold")], rows[("mlp", "ember", "warm")]
    assert cold["status"] == warm["status"] == "ok"
    assert cold["frames_traced"] == 1 and warm["frames_traced"] == 0 and warm["frames_loaded"] == 1
    assert warm["err"] < 1e-4
    sweep = rows[("dynamic", "ember", "cold")]
    assert sweep["status"] == "ok" and sweep["err"] < 1e-4 and 1 <= sweep["frames_traced"] <= 10
