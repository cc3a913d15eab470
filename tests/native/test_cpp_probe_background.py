"""The C++ compiler check starts in the background when the frontend starts tracing (not at
decoration), and ``problem()`` waits for it and answers the same."""
import shutil

import pytest
import torch

import ember
from ember.native import cpp_build

pytestmark = pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++"))), reason="no C++ compiler")


def test_probe_starts_at_trace_and_problem_waits(monkeypatch, tmp_path):
    monkeypatch.setattr(cpp_build, "_PROBED", {})
    monkeypatch.setattr(cpp_build, "_PROBE_STARTED", set())
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    ember.reset()
    fn = ember.compile(lambda x: torch.softmax(x * 3.0, -1))
    assert not cpp_build._PROBE_STARTED  # decoration starts nothing
    x = torch.randn(6, 9)
    torch.testing.assert_close(fn(x), torch.softmax(x * 3.0, -1))
    cxx = cpp_build.find_compiler()
    assert cxx in cpp_build._PROBE_STARTED
    assert cpp_build.problem() is None and cpp_build._PROBED[cxx] is None
    cpp_build.probe_in_background()  # a second start is a no-op once checked
    assert cpp_build._PROBED[cxx] is None
