"""Triton's own disk cache holds compiled kernels and the C launcher modules (.so) Triton imports into
this process: ember lets Triton use it only when every level from its root (``~/.triton`` for the
default locations) down is ours and not writable by group or others (``ember/native/triton_cache``).
An unsafe directory gets one warning and Triton is pointed at a private 0700 directory, in this
process and in the build workers; a safe one is left alone. The interpreter (CPU) may never write
Triton's cache, so these tests check where Triton is pointed after ember's first native compile."""
import importlib
import io
import logging
import os
import stat

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from ember import diskcache  # noqa: E402
from ember.native import build_pool  # noqa: E402
from ember.native import compile_aten_graph  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402

LOGGER = "ember.cache"
FOREIGN_UID = 65534  # nobody (the tests run as root, as the other cache-security tests do)


def _policy():
    try:
        return importlib.import_module("ember.native.triton_cache")
    except ImportError:
        pytest.fail("ember.native.triton_cache (Triton's cache trust check) does not exist")


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch, tmp_path):
    """As a new process: no Triton directory checked, no warning given; Triton's cache knobs (and
    the environment variables they set) restored afterwards; Triton's default home under tmp_path."""
    monkeypatch.setattr(diskcache, "_WARNED", set())
    try:
        monkeypatch.setattr(importlib.import_module("ember.native.triton_cache"), "_SAFE", set())
    except ImportError:
        pass
    with triton.knobs.cache.scope(), triton.knobs.compilation.scope():
        for knob in ("dir", "dump_dir", "override_dir", "home_dir"):
            delattr(triton.knobs.cache, knob)
        for var in ("TRITON_CACHE_DIR", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))
        yield


def _make(path, problem):
    """A directory with ``problem``: "world-writable", "foreign owner" or "safe"."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777 if problem == "world-writable" else 0o700)
    if problem == "foreign owner":
        os.chown(path, FOREIGN_UID, FOREIGN_UID)
    return str(path)


WANT = {"world-writable": "writable by group or others (mode 0777)", "foreign owner": f"owned by uid {FOREIGN_UID}"}


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def _compile_twice(ember_dir):
    x = torch.randn(4, 8, device=DEVICE)
    for _ in range(2):
        compiled = compile_aten_graph(trace(F.gelu, [x]), [x], force_triton=True, options={"cache_dir": str(ember_dir)})
        torch.testing.assert_close(compiled(x), F.gelu(x), atol=1e-5, rtol=1e-5)


def _assert_private(path, root):
    assert path.startswith(str(root) + os.sep), (path, root)
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()


@pytest.mark.parametrize("problem", ["world-writable", "foreign owner"])
@pytest.mark.parametrize("how", ["knob", "env"])
def test_first_native_compile_redirects_unsafe_cache(tmp_path, monkeypatch, caplog, problem, how):
    bad = _make(tmp_path / "shared" / "triton-cache", problem)
    if how == "knob":
        triton.knobs.cache.dir = bad
    else:
        monkeypatch.setenv("TRITON_CACHE_DIR", bad)
    ember_dir = tmp_path / "ember"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _compile_twice(ember_dir)
    now = triton.knobs.cache.dir
    assert now != bad, "Triton still uses a cache directory another user can write"
    _assert_private(now, ember_dir / "triton")
    assert os.environ["TRITON_CACHE_DIR"] == now  # (what any subprocess Triton or ember starts inherits)
    got = [w for w in _warnings(caplog) if WANT[problem] in w]
    assert len(got) == 1, _warnings(caplog)
    assert bad in got[0] and now in got[0] and "TRITON_CACHE_DIR" in got[0] and "chmod 700" in got[0], got[0]


@pytest.mark.parametrize("problem", ["world-writable", "foreign owner"])
def test_every_level_from_the_root_is_checked(tmp_path, caplog, problem):
    """Triton's default ``<home>/.triton/cache``: an unsafe ``.triton`` above a fine ``cache`` counts."""
    home = tmp_path / "home"
    _make(home / ".triton" / "cache", "safe")
    _make(home / ".triton", problem)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _policy().ensure_safe(str(tmp_path / "ember"))
    _assert_private(triton.knobs.cache.dir, tmp_path / "ember" / "triton")
    got = [w for w in _warnings(caplog) if WANT[problem] in w]
    assert len(got) == 1 and f"{home / '.triton'}:" in got[0], _warnings(caplog)


@pytest.mark.parametrize("where", ["default", "TRITON_CACHE_DIR"])
def test_safe_cache_is_left_alone(tmp_path, monkeypatch, caplog, where):
    if where == "default":
        want = str(tmp_path / "home" / ".triton" / "cache")  # (missing: created 0700, as ember's own caches are)
    else:
        want = _make(tmp_path / "mine", "safe")
        monkeypatch.setenv("TRITON_CACHE_DIR", want)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _compile_twice(tmp_path / "ember")
        _policy().ensure_safe()
    assert triton.knobs.cache.dir == want
    st = os.stat(want)  # (checked, and a missing one created private, as ember's own caches are)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert not _warnings(caplog)
    assert not os.path.exists(tmp_path / "ember" / "triton")


def test_unsafe_ember_cache_falls_back_to_scratch(tmp_path, caplog):
    triton.knobs.cache.dir = _make(tmp_path / "shared", "world-writable")
    ember_dir = _make(tmp_path / "ember", "foreign owner")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _policy().ensure_safe(ember_dir)
    now = triton.knobs.cache.dir
    _assert_private(now, diskcache.scratch_dir("triton"))
    assert not now.startswith(ember_dir)


@pytest.mark.parametrize("attr,var,flag", [("dump_dir", "TRITON_DUMP_DIR", "dump_ir"),
                                           ("override_dir", "TRITON_OVERRIDE_DIR", "override")])
def test_dump_and_override_dirs(tmp_path, monkeypatch, caplog, attr, var, flag):
    bad = _make(tmp_path / "shared", "world-writable")
    monkeypatch.setenv(var, bad)
    policy = _policy()
    policy.ensure_safe(str(tmp_path / "ember"))  # (not in use: not Triton's concern, nor ours)
    assert getattr(triton.knobs.cache, attr) == bad
    setattr(triton.knobs.compilation, flag, True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        policy.ensure_safe(str(tmp_path / "ember"))
    now = getattr(triton.knobs.cache, attr)
    _assert_private(now, tmp_path / "ember" / "triton")
    assert os.environ[var] == now
    assert any(bad in w and var in w for w in _warnings(caplog)), _warnings(caplog)


def test_checked_once_per_directory(tmp_path, monkeypatch):
    triton.knobs.cache.dir = _make(tmp_path / "shared", "world-writable")
    calls = []
    real = diskcache.dir_problem if hasattr(diskcache, "dir_problem") else None
    if real is None:
        pytest.fail("ember.diskcache.dir_problem does not exist")
    def spy(path, *a, **k):  # (ember's own caches check their directories at every use)
        if os.path.join("ember", "native") not in path:
            calls.append(path)
        return real(path, *a, **k)
    monkeypatch.setattr(diskcache, "dir_problem", spy)
    _compile_twice(tmp_path / "ember")
    first = len(calls)
    assert first >= 1
    _compile_twice(tmp_path / "ember")
    assert len(calls) == first, "Triton's cache directory was checked again after the first compile"


class _FakeProc:
    def __init__(self, args, **kwargs):
        self.kwargs = kwargs
        self.stdin, self.stdout = io.BytesIO(), io.BytesIO()

    def poll(self):
        return 0

    def wait(self, timeout=None):
        return 0


def test_build_workers_get_the_private_cache(tmp_path, monkeypatch, caplog):
    """The pool's workers build into the directory this process checked, passed explicitly."""
    bad = _make(tmp_path / "shared", "world-writable")
    monkeypatch.setenv("TRITON_CACHE_DIR", bad)
    monkeypatch.setattr(build_pool, "_POOL", None)
    monkeypatch.setattr(build_pool.subprocess, "Popen", _FakeProc)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # (only build_pool.start reads it: pools start on GPU hosts)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            pool = build_pool.start(2)
    finally:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pool is not None and pool.procs
    now = triton.knobs.cache.dir
    from ember.config import config
    _assert_private(now, os.path.join(config.cache_dir, "triton"))
    for p in pool.procs:
        env = p.kwargs.get("env")
        assert env is not None and env["TRITON_CACHE_DIR"] == now, "a build worker inherits the unsafe cache"
    assert any(bad in w for w in _warnings(caplog)), _warnings(caplog)
