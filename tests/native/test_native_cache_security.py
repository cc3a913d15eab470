"""The native backend's on-disk wrappers and kernels are Python that ember imports: they are used only
from a cache directory that is ours and private, only from bytes whose SHA-256 was recorded when they
were generated, and only through a record stored under their own graph key (``ember/diskcache.py``).
Anything else is regenerated, and every result matches eager. Kernels run on the GPU when there is
one, else in Triton's interpreter on CPU (``force_triton``), as the other native tests do."""
import logging
import os
import stat
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from ember.native import cache as ncache  # noqa: E402
from ember.native import compile_aten_graph  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402

LOGGER = "ember.cache"


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch):
    _forget(monkeypatch)


def _forget(monkeypatch):
    """As a new process: no generated module imported yet, no warning given yet."""
    monkeypatch.setattr(ncache, "_MODULES", {})
    for name in [n for n in sys.modules if n.startswith("ember_native_")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        from ember import diskcache
        monkeypatch.setattr(diskcache, "_WARNED", set())
    except ImportError:  # (ember before the policy existed: the tests must fail on their assertions)
        pass


def _compile(fn, x, root):
    return compile_aten_graph(trace(fn, [x]), [x], force_triton=True, options={"cache_dir": str(root)})


def _check(fn, x, root):
    compiled = _compile(fn, x, root)
    torch.testing.assert_close(compiled(x), fn(x), atol=1e-5, rtol=1e-5)
    return compiled


def _plant(path, marker):
    """Code appended to a generated module: it runs if the module is imported."""
    with open(path, "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').close()\n")


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("problem", ["world-writable", "foreign owner", "foreign subdirectory"])
def test_untrusted_dir_is_not_read(tmp_path, monkeypatch, caplog, problem):
    root, x, marker = tmp_path / "cache", torch.randn(4, 8, device=DEVICE), tmp_path / "marker"
    wrapper = _check(F.gelu, x, root).ember_native["wrapper"]
    _plant(wrapper, marker)
    bad = os.path.dirname(wrapper) if problem == "foreign subdirectory" else str(root)
    if problem == "world-writable":
        os.chmod(bad, 0o777)
        want = "writable by group or others"
    else:
        os.chown(bad, 65534, 65534)
        want = "owned by uid 65534"
    _forget(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        wrappers = [_check(F.gelu, x, root).ember_native["wrapper"] for _ in range(2)]
    assert not marker.exists(), "a planted wrapper ran"
    # (this process works in a private scratch directory instead)
    assert not any(w.startswith(bad) for w in wrappers), wrappers
    got = [w for w in _warnings(caplog) if want in w]
    assert len(got) == 1 and bad in got[0], _warnings(caplog)


@pytest.mark.parametrize("which", ["wrapper", "kernel"])
def test_edited_generated_module_is_regenerated(tmp_path, monkeypatch, caplog, which):
    root, x, marker = tmp_path / "cache", torch.randn(4, 8, device=DEVICE), tmp_path / "marker"
    first = _check(F.gelu, x, root)
    path = first.ember_native["wrapper"] if which == "wrapper" else first.ember_native["kernels"][0]
    good = open(path).read()
    _plant(path, marker)
    _forget(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = _check(F.gelu, x, root)
    assert not marker.exists(), f"an edited {which} ran"
    assert not again.ember_native["cache_hit"] and open(path).read() == good, "not regenerated"
    assert any("SHA-256" in w for w in _warnings(caplog)), _warnings(caplog)
    _forget(monkeypatch)
    assert _check(F.gelu, x, root).ember_native["cache_hit"]  # the regenerated files are trusted


def _record(compiled):
    return compiled.ember_native["wrapper"][:-3] + ".json"


def test_record_swapped_under_another_key_is_regenerated(tmp_path, monkeypatch, caplog):
    root, x = tmp_path / "cache", torch.randn(4, 8, device=DEVICE)
    gelu = _record(_check(F.gelu, x, root))
    relu = _record(_check(F.relu, x, root))
    with open(gelu, "rb") as f, open(relu, "wb") as g:
        g.write(f.read())  # GELU's valid record under ReLU's key
    _forget(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        compiled = _check(F.relu, x, root)  # (before: computed GELU)
    assert not compiled.ember_native["cache_hit"]
    assert any("another key" in w for w in _warnings(caplog)), _warnings(caplog)


@pytest.mark.parametrize("damage", ["truncated", "padded"])
def test_damaged_record_is_regenerated(tmp_path, monkeypatch, caplog, damage):
    root, x = tmp_path / "cache", torch.randn(4, 8, device=DEVICE)
    record = _record(_check(F.gelu, x, root))
    with open(record, "rb") as f:
        good = f.read()
    with open(record, "wb") as f:
        f.write(good[: len(good) // 2] if damage == "truncated" else good + b" ")
    _forget(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        compiled = _check(F.gelu, x, root)
    assert not compiled.ember_native["cache_hit"]
    assert len(_warnings(caplog)) == 1 and record in _warnings(caplog)[0], _warnings(caplog)
    with open(record, "rb") as f:
        assert f.read() == good


def test_created_dirs_are_private(tmp_path):
    root = tmp_path / "a" / "cache"
    old = os.umask(0o022)
    try:
        compiled = _check(F.gelu, torch.randn(4, 8, device=DEVICE), root)
    finally:
        os.umask(old)
    files = [compiled.ember_native["wrapper"], _record(compiled), *compiled.ember_native["kernels"]]
    dirs = {root, root / "native"} | {os.path.dirname(p) for p in files} | {os.path.dirname(os.path.dirname(p))
                                                                          for p in files}
    assert {oct(stat.S_IMODE(os.stat(d).st_mode)) for d in dirs} == {oct(0o700)}
    assert all(stat.S_IMODE(os.stat(p).st_mode) & 0o077 == 0 for p in files)


def test_build_worker_imports_only_the_recorded_source(tmp_path):
    """The build workers load kernel modules by path too: with the digest the parent sends."""
    from ember import diskcache
    from ember.native.build_worker import load_kernel_module
    compiled = _check(F.gelu, torch.randn(4, 8, device=DEVICE), tmp_path / "cache")
    path = compiled.ember_native["kernels"][0]
    marker = tmp_path / "marker"
    _plant(path, marker)
    with pytest.raises(diskcache.Refused, match="SHA-256"):
        load_kernel_module(path, "ember_native_test_worker", digest=os.path.basename(path)[:-3])
    assert not marker.exists()
