"""glibc malloc's thresholds on the C++ path (ember/native/cpu_heap.py, ember.config.native_cpu_malloc):
set once per process at the first CPU graph, mmap threshold before trim threshold, and left alone
when switched off, when the user tuned malloc already, or on another libc."""
import os
import subprocess
import sys

import pytest
import torch

import ember
from ember.config import config
from ember.native import backend, cpu_heap

HAS_CXX = any(map(__import__("shutil").which, ("c++", "g++")))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeLibc:
    def __init__(self, result=1):
        self.calls, self.result = [], result

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.result


@pytest.fixture
def fresh(monkeypatch):
    """This process's 'already done' forgotten (and restored after the test)."""
    monkeypatch.setattr(cpu_heap, "_DONE", [])


def test_sets_mmap_then_trim_threshold_once(fresh):
    libc = FakeLibc()
    out = cpu_heap.keep_freed_memory(True, get=lambda name: None, libc=libc)
    # mmap first: either call turns glibc's dynamic rule off, and a trim threshold alone would leave
    # the mmap threshold at 128 KiB (every tensor above it its own mmap, faulted in at each call)
    assert libc.calls == [(cpu_heap.M_MMAP_THRESHOLD, 32 << 20), (cpu_heap.M_TRIM_THRESHOLD, 64 << 20)]
    assert "32 MiB" in out and "64 MiB" in out
    assert cpu_heap.keep_freed_memory(True, get=lambda name: None, libc=libc) == out
    assert len(libc.calls) == 2  # once per process


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "0"}, {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                 {"MALLOC_TOP_PAD_": "0"}, {"MALLOC_MMAP_MAX_": "0"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}])
def test_user_settings_are_left_alone(fresh, env):
    libc = FakeLibc()
    out = cpu_heap.keep_freed_memory(True, get=env.get, libc=libc)
    assert libc.calls == [] and "left alone" in out and next(iter(env)) in out


def test_unrelated_tunables_do_not_count(fresh):
    libc = FakeLibc()
    cpu_heap.keep_freed_memory(True, get={"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"}.get, libc=libc)
    assert len(libc.calls) == 2


def test_off_and_not_glibc_change_nothing(fresh, monkeypatch):
    libc = FakeLibc()
    assert "off" in cpu_heap.keep_freed_memory(False, get=lambda name: None, libc=libc)
    assert libc.calls == []
    monkeypatch.setattr(cpu_heap, "_DONE", [])
    monkeypatch.setattr(cpu_heap, "_libc", lambda: None)
    assert "not glibc" in cpu_heap.keep_freed_memory(True, get=lambda name: None)


def test_refused_is_reported(fresh):
    assert "refused" in cpu_heap.keep_freed_memory(True, get=lambda name: None, libc=FakeLibc(result=0))


def test_real_glibc_accepts_the_values():
    """In a fresh process (this one's malloc stays as it is): glibc takes both values."""
    if cpu_heap._libc() is None:
        pytest.skip("not glibc")
    code = ("from ember.native import cpu_heap\n"
            "print(cpu_heap.keep_freed_memory(True, get=lambda name: None))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "mmap threshold 32 MiB, trim threshold 64 MiB"


@pytest.mark.skipif(not HAS_CXX, reason="no C++ compiler")
@pytest.mark.parametrize("enabled", [True, False])
def test_first_cpu_graph_applies_the_setting(fresh, monkeypatch, enabled):
    """ember.compile of a CPU function on the C++ path calls keep_freed_memory with the config's value."""
    seen = []

    def fake(on):
        seen.append(on)
        cpu_heap._DONE.append("faked")
        return "faked"
    monkeypatch.setattr(cpu_heap, "keep_freed_memory", fake)
    monkeypatch.setattr(config, "native_cpu_malloc", enabled)
    monkeypatch.setattr(config, "native_cpu", "cpp")

    def f(x):
        return torch.relu(x) * 2 + 1
    x = torch.randn(8, 16)
    torch.testing.assert_close(ember.compile(f)(x), f(x))
    assert seen == [enabled]
    backend._keep_freed_memory()  # (done for this process: not asked again)
    assert seen == [enabled]
