"""The on-disk caches trust only what this user wrote (``ember/diskcache.py``), checked against eager.

For the autograd layer's traced graphs (``aot/``) and the native backend's generated wrappers and
kernels (``native/``): a cache directory that is writable by others or owned by another user is not
read (a planted file's code never runs) and is reported once; an entry copied under another key, a
truncated, padded or garbage entry, or a generated module edited after it was written is detected,
rebuilt and replaced; the directories ember creates are 0700. Every compiled result still matches
eager PyTorch.
"""
import hashlib
import io
import logging
import operator
import os
import pickle
import stat
import sys

import pytest
import torch

import ember
from ember.aot import aot_autograd
from ember.aot import cache as aot_cache
from ember.config import config

LOGGER = "ember.cache"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test sees the policy's once-per-cause warnings anew."""
    try:
        from ember import diskcache
    except ImportError:  # (ember before the policy existed: the tests must fail on their assertions)
        return
    monkeypatch.setattr(diskcache, "_WARNED", set())


@pytest.fixture
def aot_dir(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setattr(config, "cache_dir", str(root))
    monkeypatch.setattr(config, "aot_cache", True)
    monkeypatch.setattr(aot_cache, "STATS", dict.fromkeys(aot_cache.STATS, 0))
    return root


def _model(act):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 6), act)


def _run(model, x):
    """Compiled output and parameter gradients of one training step."""
    out = ember.compile(model, backend=aot_autograd())(x)
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def _check_vs_eager(act, x):
    ref, model = _model(act), _model(act)
    want = ref(x)
    want.sum().backward()
    out, grads = _run(model, x)
    torch.testing.assert_close(out, want.detach())
    for g, p in zip(grads, ref.parameters()):
        torch.testing.assert_close(g, p.grad)


def _entries(root):
    return sorted(root.glob("aot/*/*.pkl"))


class _Plant:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _plant(path, marker):
    path.write_bytes(pickle.dumps({"kind": _Plant(marker)}))


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def _header(path):
    return path.read_bytes().split(b"\n", 1)[0].decode(errors="replace")


# ------------------------------------------------------------------------------------------------ aot

@pytest.mark.parametrize("problem", ["world-writable", "foreign owner", "foreign subdirectory"])
def test_aot_untrusted_dir_is_not_read(aot_dir, tmp_path, caplog, problem):
    x = torch.randn(3, 6)
    _run(_model(torch.nn.GELU()), x)  # an entry, so the planted file sits at a path ember will read
    (entry,) = _entries(aot_dir)
    marker = tmp_path / "marker"
    _plant(entry, marker)
    bad = entry.parent if problem == "foreign subdirectory" else aot_dir
    if problem == "world-writable":
        os.chmod(bad, 0o777)
        want = "writable by group or others"
    else:
        os.chown(bad, 65534, 65534)
        want = "owned by uid 65534"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2):  # two compiles: the same problem is reported once
            _check_vs_eager(torch.nn.GELU(), x)
    assert not marker.exists(), "a planted pickle ran"
    assert aot_cache.STATS["hits"] == 0
    got = [w for w in _warnings(caplog) if want in w]
    assert len(got) == 1 and str(bad) in got[0] and "fix" in got[0], _warnings(caplog)
    assert entry.read_bytes().startswith(b"\x80"), "a refused directory was written to"


@pytest.mark.parametrize("envelope", [False, True])
def test_aot_planted_pickle_in_our_own_dir_does_not_run(aot_dir, tmp_path, envelope):
    """A pickle planted in a directory that passes the ownership checks: without an envelope it is
    not an entry; with a forged one that checks out, unpickling is restricted to plain data."""
    x = torch.randn(3, 6)
    _run(_model(torch.nn.GELU()), x)
    (entry,) = _entries(aot_dir)
    marker = tmp_path / "marker"
    _plant(entry, marker)
    if envelope:
        key, body = entry.stem, entry.read_bytes()
        entry.write_bytes(b"EMBER-CACHE/1 aot %s %s %d\n" % (key.encode(), hashlib.sha256(body).hexdigest().encode(),
                                                              len(body)) + body)
    _check_vs_eager(torch.nn.GELU(), x)
    assert not marker.exists(), "a planted pickle ran"
    assert aot_cache.STATS["hits"] == 0
    assert b"builtins" not in entry.read_bytes(), "the planted entry was not replaced"


def test_aot_unpickler_allows_plain_data_only(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode
    marker = tmp_path / "marker"
    for bad in (pickle.dumps(_Plant(marker)), pickle.dumps(torch.ones(2)), pickle.dumps(os.system),
                pickle.dumps(getattr)):
        with pytest.raises(pickle.UnpicklingError, match="not allowed"):
            aot_cache._Unpickler(io.BytesIO(bad), FakeTensorMode()).load()
    assert not marker.exists()
    ok = {"t": torch.float16, "d": torch.device("cpu"), "s": torch.Size([2]), "f": operator.getitem, "sl": slice(1, 2)}
    assert aot_cache._Unpickler(io.BytesIO(pickle.dumps(ok)), FakeTensorMode()).load() == ok


def test_aot_entry_swapped_under_another_key_is_rebuilt(aot_dir, caplog):
    x = torch.randn(3, 6)
    _run(_model(torch.nn.GELU()), x)
    (gelu,) = _entries(aot_dir)
    _run(_model(torch.nn.ReLU()), x)
    (relu,) = set(_entries(aot_dir)) - {gelu}
    relu_bytes = relu.read_bytes()
    relu.write_bytes(gelu.read_bytes())  # a valid entry, under another model's name
    aot_cache.STATS.update(hits=0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _check_vs_eager(torch.nn.ReLU(), x)  # (before: the ReLU model computed GELU)
    assert aot_cache.STATS["hits"] == 0
    assert any("another key" in w for w in _warnings(caplog)), _warnings(caplog)
    assert relu.read_bytes() == relu_bytes, "the swapped entry was not replaced by a rebuilt one"
    aot_cache.STATS.update(hits=0)
    _check_vs_eager(torch.nn.ReLU(), x)
    assert aot_cache.STATS["hits"] == 1  # the rebuilt entry is trusted again


@pytest.mark.parametrize("damage", ["truncated", "padded", "garbage", "flipped"])
def test_aot_damaged_entry_is_rebuilt(aot_dir, caplog, damage):
    x = torch.randn(3, 6)
    _run(_model(torch.nn.GELU()), x)
    (entry,) = _entries(aot_dir)
    good = entry.read_bytes()
    body = {"truncated": good[: len(good) // 2], "padded": good + b"\x00" * 16, "garbage": os.urandom(300),
            "flipped": good[:-40] + bytes([good[-40] ^ 1]) + good[-39:]}[damage]
    entry.write_bytes(body)
    aot_cache.STATS.update(hits=0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _check_vs_eager(torch.nn.GELU(), x)
    assert aot_cache.STATS["hits"] == 0
    assert len(_warnings(caplog)) == 1 and str(entry) in _warnings(caplog)[0], _warnings(caplog)
    assert entry.read_bytes() == good, "the damaged entry was not replaced"


def test_created_dirs_are_private(tmp_path, monkeypatch):
    root = tmp_path / "new" / "cache"
    monkeypatch.setattr(config, "cache_dir", str(root))
    monkeypatch.setattr(config, "aot_cache", True)
    old = os.umask(0o022)
    try:
        _check_vs_eager(torch.nn.GELU(), torch.randn(3, 6))
    finally:
        os.umask(old)
    (entry,) = _entries(root)
    levels = [root, entry.parent.parent, entry.parent]
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in levels] == [oct(0o700)] * 3
    assert stat.S_IMODE(entry.stat().st_mode) & 0o077 == 0


def test_unwritable_cache_dir_never_raises(tmp_path, monkeypatch, caplog):
    """A cache_dir that is a file: warned about once, compiles still run and match eager."""
    bad = tmp_path / "file"
    bad.write_text("x")
    monkeypatch.setattr(config, "cache_dir", str(bad))
    monkeypatch.setattr(config, "aot_cache", True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _check_vs_eager(torch.nn.GELU(), torch.randn(3, 6))
        _check_vs_eager(torch.nn.GELU(), torch.randn(3, 6))
    assert len([w for w in _warnings(caplog) if str(bad) in w]) == 1, _warnings(caplog)


@pytest.mark.slow  # (two Python processes, ~20 s)
def test_a_fresh_process_ignores_a_planted_pickle_in_a_shared_dir(tmp_path):
    """The reported case end to end: a world-writable cache directory owned by another user, a
    crafted pickle at an entry's path; a new process warns once on stderr and matches eager."""
    import subprocess
    import textwrap
    script = textwrap.dedent("""
        import torch, ember
        from ember.aot import aot_autograd
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU())
        x = torch.randn(3, 6, requires_grad=True)
        for _ in range(2):
            out = ember.compile(m, backend=aot_autograd())(x)
            torch.testing.assert_close(out, m(x))
        print("ok")
    """)
    root = tmp_path / "shared"
    env = dict(os.environ, EMBER_CACHE_DIR=str(root))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    (entry,) = _entries(root)
    marker = tmp_path / "marker"
    _plant(entry, marker)
    os.chmod(root, 0o777)
    os.chown(root, 65534, 65534)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and second.stdout.split()[-1] == "ok", second.stderr[-2000:]
    assert not marker.exists(), "a planted pickle ran"
    assert second.stderr.count(f"not using the cache directory {root}") == 1, second.stderr[-2000:]
