"""The `ember` command line and the documented config table."""
import subprocess
import sys
import textwrap
from pathlib import Path

import ember
from ember.config import ENV_TABLE, markdown_table

REPO = Path(__file__).resolve().parents[1]


def _ember(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_version_and_backends():
    res = _ember("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"ember {ember.__version__}"
    res = _ember("backends")
    lines = res.stdout.splitlines()
    assert res.returncode == 0
    assert any(ln.startswith("ember") for ln in lines)
    assert any(ln.startswith("inductor") and "alias of ember" in ln for ln in lines)
    assert any(ln.startswith("eager") and "debug" in ln for ln in lines)


def test_run_routes_torch_compile_to_ember(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch

        @torch.compile
        def f(x):
            return torch.relu(x) + 1

        x = torch.tensor([-1.0, 2.0])
        print(type(f).__module__, type(f).__name__, f(x).tolist(), sys.argv[1:])
        with torch.compiler.set_stance("force_eager"):
            print("stance", f(x).tolist())
        torch.compiler.reset()
        sys.exit(3)
    """))
    res = _ember("run", str(script), "--flag", "value", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert res.stdout.splitlines() == ["ember.api EmberFunction [1.0, 3.0] ['--flag', 'value']", "stance [1.0, 3.0]"]


def test_config_table_is_documented_and_printed():
    doc = (REPO / "docs" / "config.md").read_text()
    assert markdown_table() in doc, "docs/config.md is stale: paste ember.config.markdown_table() into it"
    res = _ember("config")
    assert res.returncode == 0
    for env, name, _default, _doc in ENV_TABLE:
        assert env in res.stdout and name in res.stdout


def test_python_dash_m_ember_is_the_ember_command():
    res = subprocess.run([sys.executable, "-m", "ember", "--version"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == f"ember {ember.__version__}"


def test_run_without_a_script_or_with_a_missing_one_says_so(tmp_path):
    res = _ember("run", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith("usage: ember run SCRIPT.py [ARGS...]") and "Traceback" not in res.stderr
    res = _ember("run", "nope.py", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("ember run: nope.py: no such file") and "Traceback" not in res.stderr


def test_a_failing_script_shows_its_own_traceback_only(tmp_path):
    (tmp_path / "fails.py").write_text("def g(x):\n    raise ValueError('bad input')\n\n\ng(1)\n")
    res = _ember("run", "fails.py", cwd=tmp_path)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: bad input"
    assert "cli.py" not in res.stderr and "runpy" not in res.stderr
