"""Shared pytest setup: a fixed torch seed per test; `gpu`-marked tests skip without CUDA.

Without a GPU, Triton kernels run in Triton's interpreter, which must be chosen before anything
imports triton (the native backend's tests, or any test compiling through the default backend).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _session_cache_dir(tmp_path_factory):
    """On-disk caches (traced graphs, native wrappers) start empty each run: a test never passes
    on what an earlier run of other code stored, nor finds what an earlier run of the same code
    stored. Subprocesses (scripts under ``ember run``, distributed ranks) get the same directory
    through EMBER_CACHE_DIR; without it they shared ~/.cache/ember, and a second run of the suite
    on an unchanged ember loaded their frames instead of compiling them."""
    from ember.config import config
    saved, saved_env = config.cache_dir, os.environ.get("EMBER_CACHE_DIR")
    config.cache_dir = os.environ["EMBER_CACHE_DIR"] = str(tmp_path_factory.mktemp("ember_cache"))
    yield
    config.cache_dir = saved
    if saved_env is None:
        os.environ.pop("EMBER_CACHE_DIR", None)
    else:
        os.environ["EMBER_CACHE_DIR"] = saved_env


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _restore_global_torch_state():
    """A failing test must not leak grad mode / autocast / default dtype into the next one."""
    grad = torch.is_grad_enabled()
    dtype = torch.get_default_dtype()
    yield
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)
    torch.set_autocast_enabled("cpu", False)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
