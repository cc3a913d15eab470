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
    """A failing test must not leak grad mode / autocast / default dtype / the SDPA and oneDNN
    switches into the next one. An autocast entered and never left (``autocast.__enter__()`` by hand)
    also leaves its nesting count up, and then no later autocast region clears the cast cache on
    exit: a float16 region reused the bfloat16 copy of a weight cast in an earlier one."""
    grad = torch.is_grad_enabled()
    dtype = torch.get_default_dtype()
    nesting = _autocast_nesting()
    switches = [(get(), set_) for get, set_ in _SWITCHES]
    yield
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)
    torch.set_autocast_enabled("cpu", False)
    for value, set_ in switches:
        set_(value)
    while _autocast_nesting() > nesting:
        torch.autocast_decrement_nesting()
    if nesting == 0:
        torch.clear_autocast_cache()


_SWITCHES = [(torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.enable_flash_sdp),
             (torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.enable_math_sdp),
             (torch.backends.cuda.mem_efficient_sdp_enabled, torch.backends.cuda.enable_mem_efficient_sdp),
             (torch._C._get_mkldnn_enabled, torch._C._set_mkldnn_enabled),
             (torch._C._get_cudnn_enabled, torch._C._set_cudnn_enabled)]


def _autocast_nesting() -> int:
    n = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return n - 1


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
