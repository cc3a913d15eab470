""".ci/run keeps README's contract: the install and test commands it runs are lines of README.md
(its own check, run here so drift shows before CI), and it runs them twice: with the interpreter
CI provides and inside a fresh ``python -m venv``."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / ".ci" / "run").read_text()


def _var(name: str) -> str:
    m = re.search(rf"^{name}='(.*)'$", SCRIPT, re.M)
    assert m, f".ci/run defines no {name}='...'"
    return m.group(1)


def test_ci_commands_are_readme_lines():
    readme = (REPO / "README.md").read_text().splitlines()
    for name in ("INSTALL_CMD", "TEST_CMD"):
        assert _var(name) in readme, f"README.md has no line {_var(name)!r} ({name} of .ci/run)"


def test_ci_runs_readme_commands_in_a_fresh_venv_too():
    body = SCRIPT[SCRIPT.index("install_and_test() {"):]
    calls = [m.start() for m in re.finditer(r"^\s*install_and_test\s*$", body, re.M)]
    venv = body.index('python -m venv "$VENV"')
    activate = body.index('. "$VENV/bin/activate"')
    assert len(calls) == 2 and calls[0] < venv < activate < calls[1], "expected: run, make venv, activate, run"


def test_ci_script_parses():
    subprocess.run(["bash", "-n", str(REPO / ".ci" / "run")], check=True)
