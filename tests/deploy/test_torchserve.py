"""TorchServe serving a model compiled by ember, end to end: ``examples/torchserve/run.sh`` builds the
archives, starts TorchServe on 127.0.0.1, registers the eager, ember (native) and, where OpenVINO is
installed, openvino variants, and sends >= 1,000 requests from 8 concurrent clients to each; every
answer must equal eager PyTorch's, none may be a server error, every answer of a compiled variant
must show compiled graphs serving it (and no compile after the warm-up), and malformed requests get
HTTP 400 while the server keeps serving. The script stops the server in all cases.

Slow (about two minutes) and needs TorchServe and Java 17, so it is marked ``slow`` and ``serve`` and
skips without them. Run it with

    pip install torchserve==0.12.0 torch-model-archiver==0.12.0   # and Java 17: examples/torchserve/install_java.sh
    python -m pytest -q tests/deploy/test_torchserve.py -m serve
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serve]

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "examples" / "torchserve" / "run.sh"
REQUESTS, CLIENTS = 1000, 8


def _missing() -> str | None:
    for tool in ("java", "torchserve", "torch-model-archiver", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (see examples/torchserve/run.sh)"
    version = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    major = re.search(r'version "(\d+)', version)
    if major is None or int(major.group(1)) < 17:
        return f"TorchServe 0.12 needs Java 17; found: {version.strip().splitlines()[:1]}"
    for module in ("ts", "requests"):
        try:
            __import__(module)
        except ImportError:
            return f"python package {module} is not installed"
    return None


def _free_port_base() -> int:
    """A port p with p, p+1, p+2 free on 127.0.0.1 (inference, management, metrics)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + 2 > 65535:
            continue
        try:
            for p in (base + 1, base + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    pytest.skip("no three consecutive free ports on 127.0.0.1")


def _has_openvino() -> bool:
    try:
        import openvino  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.mark.timeout(1500)
def test_torchserve_serves_ember_compiled_model(tmp_path):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    variants = "eager ember" + (" openvino" if _has_openvino() else "")
    report_path = tmp_path / "report.json"
    env = dict(os.environ, PYTHON=sys.executable)
    cmd = ["bash", str(RUN), "--no-install", "--requests", str(REQUESTS), "--clients", str(CLIENTS),
           "--variants", variants, "--work", str(tmp_path / "work"), "--report", str(report_path),
           "--port", str(port := _free_port_base())]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # run.sh's trap stops TorchServe
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"run.sh timed out:\n{out[-4000:]}")
    print(out)
    assert report_path.exists(), f"run.sh wrote no report (exit {proc.returncode}):\n{out[-4000:]}"
    report = json.loads(report_path.read_text())
    rows = {r["model"]: r for r in report["models"]}
    assert sorted(rows) == sorted(f"tinynet_{v}" for v in variants.split())
    for name, r in rows.items():
        assert r["requests"] >= 1000 and r["clients"] == 8, name
        assert (r["ok"], r["wrong"], r["server_errors"], r["client_errors"]) == (r["requests"], 0, 0, 0), (name, r["examples"])
        bad = r["bad_requests"]
        assert bad["still_serving"], name
        for case, res in bad["cases"].items():
            assert res["status"] == 400 and "send one float32 array" in res["error"], (name, case, res)
        if name != "tinynet_eager":
            # compiled graphs answered every request: the handler's counts of compiled-graph calls
            # grew during the test, no eager fallback, and no compile after the warm-up
            assert r["not_compiled_answers"] == 0 and r["eager_fallbacks"] == 0, (name, r)
            assert r["graph_calls_during_test"] > 0 and len(r["graphs"]) == 1 and r["graphs"][0] >= 1, (name, r)
    if shutil.which("c++") or shutil.which("g++"):  # the native backend's default on a CPU: C++ kernels
        assert rows["tinynet_ember"]["renderers"].get("cpp", 0) >= 1, rows["tinynet_ember"]
    assert report["passed"] and proc.returncode == 0, out[-4000:]
    with socket.socket() as s:  # the server is gone: nothing listens on its inference port
        assert s.connect_ex(("127.0.0.1", port)) != 0, "TorchServe still running after run.sh"
