"""Unmodified torch.compile scripts (tests/run/scripts) print under `ember run` exactly what they print
under plain Python with torch.compile, and ember compiled their graphs.

``expected/<script>.out`` is each script's stdout under plain Python (torch.compile with inductor):
``python tests/run/test_run_scripts.py --regen`` rewrites them, and the slow test checks them against
plain Python again (inductor compiles C++ for every script: minutes). The fast test runs every script
under `ember run` in one interpreter (tests/run/driver.py: one torch and one transformers import), and
two through the real `python -m ember run` command line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted((HERE / "scripts").glob("*.py"))
REPO = HERE.parents[1]
NEEDS = {"hf_gpt2_tiny.py": "transformers", "hf_bert_tiny.py": "transformers"}
# scripts whose eager fallbacks are their point (a recompile limit the script sets)
FALLBACKS = {"cache_size_limit.py": 3}


def _available(script: Path) -> bool:
    need = NEEDS.get(script.name)
    if need is None:
        return True
    import importlib.util

    return importlib.util.find_spec(need) is not None


def _env(**extra) -> dict:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _expected(script: Path) -> str:
    return (HERE / "expected" / (script.stem + ".out")).read_text()


def test_there_are_at_least_thirty_scripts_each_with_its_expected_output():
    assert len(SCRIPTS) >= 30
    for s in SCRIPTS:
        assert (HERE / "expected" / (s.stem + ".out")).is_file(), f"no expected output for {s.name}: --regen"
        assert "ember" not in s.read_text(), f"{s.name} must be an unmodified torch.compile script"


def test_every_script_prints_the_same_under_ember_run_and_ember_compiled_it():
    scripts = [s for s in SCRIPTS if _available(s)]
    res = subprocess.run([sys.executable, str(HERE / "driver.py"), *map(str, scripts)], capture_output=True,
                         text=True, env=_env(), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    results = {d["script"]: d for d in map(json.loads, res.stdout.splitlines())}
    assert sorted(results) == sorted(s.name for s in scripts)
    problems = []
    for s in scripts:
        d = results[s.name]
        if d["rc"] != 0:
            problems.append(f"{s.name}: exit {d['rc']}")
        elif d["stdout"] != _expected(s):
            problems.append(f"{s.name}: stdout differs\n--- ember run\n{d['stdout']}--- python\n{_expected(s)}")
        if d["counters"].get("graphs_compiled", 0) < 1:
            problems.append(f"{s.name}: ember compiled no graph ({d['counters']})")
        if d["counters"].get("eager_fallbacks", 0) != FALLBACKS.get(s.name, 0):
            problems.append(f"{s.name}: eager fallbacks {d['counters']}")
    assert not problems, "\n".join(problems) + "\n" + res.stderr[-3000:]
    # mark_dynamic: one graph for four sizes (the first compile is already symbolic: no recompile)
    assert results["mark_dynamic.py"]["counters"].get("graphs_compiled") == 1
    assert "recompiles" not in results["mark_dynamic.py"]["counters"]


@pytest.mark.parametrize("name", ["mark_dynamic.py", "cache_size_limit.py"])
def test_the_command_line_runs_a_script_and_writes_its_stats(tmp_path, name):
    stats = tmp_path / "stats.json"
    res = subprocess.run([sys.executable, "-m", "ember", "run", name], capture_output=True, text=True,
                         cwd=HERE / "scripts", env=_env(EMBER_RUN_STATS=str(stats)), timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout == _expected(HERE / "scripts" / name)
    counts = json.loads(stats.read_text())
    assert counts["graphs_compiled"] >= 1
    if name == "cache_size_limit.py":  # the script's limit of 2 reached ember, and the warning names its line
        assert counts["graphs_compiled"] == 2 and counts["eager_fallbacks.recompile_limit"] == 3
        assert "cache_size_limit.py:13: UserWarning: ember: scale hit the recompile limit (2)" in res.stderr
        assert "the int argument k changed value" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_expected_output_is_what_plain_python_prints(script):
    if not _available(script):
        pytest.skip(f"needs {NEEDS[script.name]}")
    res = subprocess.run([sys.executable, script.name], capture_output=True, text=True, cwd=script.parent,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == _expected(script)


if __name__ == "__main__" and sys.argv[1:] == ["--regen"]:
    for s in SCRIPTS:
        out = subprocess.run([sys.executable, s.name], capture_output=True, text=True, cwd=s.parent, check=True)
        (HERE / "expected" / (s.stem + ".out")).write_text(out.stdout)
        print("wrote", s.stem + ".out")
