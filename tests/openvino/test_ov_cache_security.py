"""``model_caching`` trusts only what this user wrote (``ember/diskcache.py``), checked against eager: a
converted IR or a whole-graph record copied under another model's key is detected and converted
again; a cache tree that others can write is not read (warned about once); the directories ember
creates are 0700."""
import logging
import os
import shutil
import stat

import pytest

from tests.openvino.conftest import require_openvino  # noqa: E402

require_openvino()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ember  # noqa: E402
from tests.openvino.helpers import F32, rel_err  # noqa: E402

LOGGER = "ember.cache"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    try:
        from ember import diskcache
    except ImportError:  # (ember before the policy existed: the tests must fail on their assertions)
        return
    monkeypatch.setattr(diskcache, "_WARNED", set())


def _model(act):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 6), act).eval()


def _check(act, root):
    """Compile (a fresh ember.compile, as a new process would) and compare with eager."""
    model, x = _model(act), torch.randn(3, 6)
    compiled = ember.compile(model, backend="openvino", options=dict(F32, model_caching=True, cache_dir=str(root)))
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert rel_err(got, want) < 1e-4, f"{type(act).__name__}: results differ from eager"


def _files(root, pattern):
    return set((root / "ember_openvino").glob(pattern))


def _gelu_and_relu(root, pattern):
    """Cache files of a GELU model and of a ReLU model (same shapes, different graphs)."""
    _check(nn.GELU(), root)
    gelu = _files(root, pattern)
    _check(nn.ReLU(), root)
    relu = _files(root, pattern) - gelu
    assert len(gelu) == len(relu) == 1, (gelu, relu)
    return gelu.pop(), relu.pop()


def _swap_ir(root):
    gelu, relu = _gelu_and_relu(root, "ir/*/*.xml")
    for ext in (".xml", ".bin", ".sum"):  # GELU's whole converted model, under ReLU's key
        src = gelu.with_suffix(ext)
        if src.exists():
            shutil.copyfile(src, relu.with_suffix(ext))


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_ir_swapped_under_another_key_is_converted_again(tmp_path, caplog):
    _swap_ir(tmp_path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _check(nn.ReLU(), tmp_path)  # (before: the ReLU model computed GELU)
    assert any("another key" in w for w in _warnings(caplog)), _warnings(caplog)


def test_record_swapped_under_another_key_is_rebuilt(tmp_path, caplog):
    gelu, relu = _gelu_and_relu(tmp_path, "graphs/*.json")
    shutil.copyfile(gelu, relu)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _check(nn.ReLU(), tmp_path)
    assert any("another key" in w for w in _warnings(caplog)), _warnings(caplog)


def test_world_writable_cache_is_not_read(tmp_path, caplog):
    _swap_ir(tmp_path)
    os.chmod(tmp_path / "ember_openvino", 0o777)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _check(nn.ReLU(), tmp_path)
        _check(nn.ReLU(), tmp_path)
    got = [w for w in _warnings(caplog) if "writable by group or others" in w]
    assert len(got) == 1 and str(tmp_path / "ember_openvino") in got[0], _warnings(caplog)


def test_created_dirs_are_private(tmp_path):
    root = tmp_path / "cache"
    old = os.umask(0o022)
    try:
        _check(nn.GELU(), root)
    finally:
        os.umask(old)
    top = root / "ember_openvino"
    dirs = {root, top, top / "blobs", top / "graphs", top / "ir"} | {p.parent for p in _files(root, "ir/*/*.xml")}
    assert len(dirs) == 6 and {oct(stat.S_IMODE(d.stat().st_mode)) for d in dirs} == {oct(0o700)}
