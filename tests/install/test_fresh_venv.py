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


def running_site_dirs() -> list[str]:
    """The site-packages directories this interpreter imports from, in its order: the venv's own (and
    its base's, if it was made with --system-site-packages) when run from a venv, the interpreter's
    when run from a system interpreter. ``venv --system-site-packages`` would offer the *base*
    interpreter's instead, which inside a venv has neither torch nor pip."""
    return [p for p in dict.fromkeys(sys.path)
            if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def make_venv(venv: Path) -> Path:
    """A fresh venv that sees the running environment's packages (torch, pip, setuptools: no
    multi-GB download) through a .pth file, behind its own site-packages. Only the directories are
    added, not the .pth files inside them, so an editable ember of the running environment (its
    finder lives in such a .pth file) stays invisible and the venv's own install is the one tested."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    own = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    (Path(own) / "_ember_test_running_env.pth").write_text("\n".join(running_site_dirs()) + "\n")
    return py


def test_running_environment_is_what_the_venv_sees(tmp_path):
    """The venv sees torch and pip where the running interpreter finds them, in a venv or not."""
    py = make_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import torch, pip, sys; print(torch.__file__); print(sys.prefix)"
    res = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    torch_file, prefix = res.stdout.split()
    import torch
    assert torch_file == torch.__file__ and prefix == str(tmp_path / "venv")


def test_torch_compile_backend_ember_in_a_fresh_venv(tmp_path):
    py = make_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    str(REPO)], check=True, env=env, cwd=tmp_path)
    res = subprocess.run([str(py), "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().startswith("OK")
