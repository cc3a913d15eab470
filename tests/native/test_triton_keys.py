"""Triton's cache key stored under a fingerprint of the files it hashes (ember/native/triton_keys.py)."""
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
import triton.runtime.cache as tcache  # noqa: E402

from ember.config import config  # noqa: E402
from ember.native import build_worker, triton_keys  # noqa: E402


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(triton_keys, "_INSTALLED", None)
    monkeypatch.setattr(tcache, "triton_key", tcache.triton_key)  # (put Triton's own back afterwards)
    return tmp_path


def test_stored_key_is_tritons_and_is_reused(fresh, monkeypatch):
    real = tcache.triton_key()
    assert not triton_keys.load()  # nothing stored yet
    assert triton_keys.compute_and_store() == real
    assert triton_keys.load()
    assert triton_keys.installed() == real
    assert tcache.triton_key() == real and not hasattr(tcache.triton_key, "cache_info")  # (ours, not the hash)
    assert triton_keys.worker_args() == ["--triton-key", real]


def test_changed_triton_file_misses(fresh, monkeypatch):
    triton_keys.compute_and_store()
    fp = triton_keys.fingerprint()
    real_stat = os.stat
    lib = next(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(os.path.dirname(triton.__file__), "_C"))
               for f in fs if f.startswith("libtriton"))

    def stat(p, *a, **k):  # libtriton rebuilt: same path, another size
        st = real_stat(p, *a, **k)
        if os.path.abspath(p) == os.path.abspath(lib):
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid,
                                   st.st_size + 1, st.st_atime, st.st_mtime, st.st_ctime))
        return st
    monkeypatch.setattr(os, "stat", stat)
    assert triton_keys.fingerprint() != fp
    assert not triton_keys.load()


def test_tampered_entry_is_not_used(fresh):
    triton_keys.compute_and_store()
    path, _ = triton_keys._path(triton_keys.fingerprint())
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-3] + b"xyz")  # the checksum no longer holds
    assert not triton_keys.load()


def test_worker_uses_the_given_key():
    """A build worker handed the key answers with it and never hashes Triton."""
    code = ("import sys, runpy; sys.argv = [sys.argv[0], '--triton-key', 'K123'];"
            "m = runpy.run_path(%r); m['_install_key']('K123');"
            "import triton.runtime.cache as c; print(c.triton_key())") % build_worker.__file__
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("K123"), out.stderr[-2000:]


def test_worker_started_with_a_key_is_ready(monkeypatch):
    """The command line build_pool gives a worker: it says ready (stdin closed: it then exits)."""
    monkeypatch.setattr(triton_keys, "_INSTALLED", "K123")
    out = subprocess.run([sys.executable, build_worker.__file__, *triton_keys.worker_args()], input="",
                         capture_output=True, text=True, timeout=120)
    assert '"ready": true' in out.stdout, out.stderr[-2000:]
