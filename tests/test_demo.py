"""The README's main job (`python -m ember.demo`): it must pass, say which code ran the graphs, and
report its timing as rounds with a spread at a fixed thread count."""
import re

import pytest

pytest.importorskip("transformers")


def test_demo_passes_and_reports_backend_and_spread(capsys):
    from ember import demo

    assert demo.main(["--device", "cpu", "--rounds", "2", "--iters", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "RESULT: PASS" in out
    assert "1 CPU threads" in out or "1 CPU thread" in out
    backend = re.search(r"^backend: ember \(native\) on cpu; (.*)$", out, re.M)
    assert backend and "graph(s)" in backend.group(1), out
    assert re.search(r"^ember\s+[\d.]+\s+[\d.]+\s+[\d.]+-[\d.]+\s+[\d.]+x$", out, re.M), out
