"""Installing ember offers its backend to plain PyTorch: ``torch.compile(m, backend="ember")`` works
in a fresh virtual environment after ``pip install`` of this repository (a real, non-editable install,
so the entry point comes from the installed package's metadata, not from this checkout)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = textwrap.dedent("""
    import sys, importlib.metadata as md
    import torch, ember
    assert ember.__file__.startswith(sys.prefix), ("ember imported from outside the venv", ember.__file__)
    dist = md.distribution("ember")
    assert str(dist.locate_file("")).startswith(sys.prefix), dist.locate_file("")
    assert any(ep.name == "ember" for ep in dist.entry_points if ep.group == "torch_dynamo_backends")

    calls = []
    from ember.backends import registry
    spec = registry.backend_spec("ember")
    inner = spec.fn
    def counting(gm, example_inputs, **kw):
        calls.append(len(gm.graph.nodes))
        return inner(gm, example_inputs, **kw)
    spec.fn = counting

    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    out = torch.compile(m, backend="ember")(x)
    assert torch.allclose(out, m(x)), "result differs from eager"
    assert calls, "torch.compile did not call ember's backend"
    print("OK", len(calls))
""")


def test_torch_compile_backend_ember_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    # torch (a multi-GB download otherwise), pip and setuptools come from the base interpreter; ember is
    # installed fresh into the venv
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    str(REPO)], check=True, env=env, cwd=tmp_path)
    res = subprocess.run([str(py), "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().startswith("OK")
