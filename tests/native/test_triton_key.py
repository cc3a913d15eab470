"""Triton's cache key computed in a child process (ember/triton_key.py): the same value as
Triton's own ``triton_key()``, installed so that this process's Triton answers it without hashing."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

from ember import triton_key as key_process  # noqa: E402


@pytest.fixture
def fresh(monkeypatch):
    """A module state of its own, and Triton's functions put back after the test."""
    from triton.runtime import autotuner, cache
    saved = (cache.triton_key, autotuner.triton_key)
    monkeypatch.setattr(key_process, "_PROC", None)
    monkeypatch.setattr(key_process, "_LINES", [])
    yield
    cache.triton_key, autotuner.triton_key = saved


def test_the_childs_key_is_tritons_own_and_is_installed(fresh):
    from triton.runtime import autotuner, cache
    key_process.start()
    assert key_process.started()
    key = key_process.result()
    assert key == cache.triton_key.__wrapped__()  # (Triton's function, hashed here: the same value)
    key_process.install(key)
    assert cache.triton_key() == key and autotuner.triton_key() == key
    assert cache.triton_key.ember_key == key
    cache.triton_key.cache_clear()  # (still an lru_cache: callers that clear it keep working)


def test_a_failing_child_installs_nothing(fresh, monkeypatch):
    from triton.runtime import cache
    before = cache.triton_key  # (a GPU machine's earlier compiles may have installed the import's child key)
    monkeypatch.setattr(key_process, "_CHILD", "raise SystemExit(3)")
    key_process.start()
    assert key_process.result() is None
    from ember.native import runtime
    monkeypatch.setattr(runtime, "_PREWARM", None)
    runtime.prewarm_triton_key()  # falls back to hashing here
    if runtime._PREWARM:
        runtime._PREWARM.join()
    assert cache.triton_key is before


@pytest.mark.parametrize("env, device, expected", [
    ({}, True, True),
    ({"EMBER_TRITON_KEY_PROCESS": "0"}, True, False),
    ({"TRITON_INTERPRET": "1"}, True, False),
    ({}, False, False),
])
def test_when_import_starts_it(monkeypatch, env, device, expected):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("EMBER_TRITON_KEY_PROCESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import ember
    monkeypatch.setattr(ember.config, "triton_key_process", env.get("EMBER_TRITON_KEY_PROCESS") != "0")
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: device if p == "/dev/nvidiactl" else real_exists(p))
    assert key_process.wanted() is expected


def test_import_ember_without_a_gpu_starts_no_child():
    code = ("import ember, ember.triton_key as k; import sys; "
            "sys.exit(0 if (k.started() == __import__('os').path.exists('/dev/nvidiactl')) else 1)")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
