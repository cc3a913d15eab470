"""Sharing cores between PyTorch's and OpenVINO's thread pools.

PyTorch runs CPU ops on an OpenMP pool, OpenVINO on its own TBB pool. Both keep their worker threads
spinning for a while after each parallel region, so when a graph alternates between the two (a
partition, a PyTorch op, a partition...), one pool's spinning workers steal the cores the other pool
is computing on. On a 2-core machine this made a 6 ms convnet take 60 ms or more. The policy:

* OpenVINO uses as many threads as PyTorch (``INFERENCE_NUM_THREADS = torch.get_num_threads()`` at
  compile time), so ``torch.set_num_threads`` bounds both runtimes alike.
* A graph that mixes OpenVINO partitions with PyTorch compute ops runs its PyTorch ops with one thread
  (``torch.set_num_threads(1)`` for the duration of the call, restored afterwards): the heavy ops are
  in the partitions, and a single PyTorch thread has no workers to spin. Fully converted graphs and
  graphs left entirely to PyTorch are not touched.
* Setting ``INFERENCE_NUM_THREADS`` in the ``config`` option turns both rules off: the user decides.
"""
from __future__ import annotations

import torch

from ember.backends.openvino.options import OVOptions


def user_controls_threads(opts: OVOptions) -> bool:
    return "INFERENCE_NUM_THREADS" in opts.config_dict


def compile_config(opts: OVOptions) -> dict:
    """The compile_model properties: the user's, plus the thread count unless the user set one."""
    config = opts.config_dict
    if not user_controls_threads(opts) and opts.device.startswith("CPU"):
        config["INFERENCE_NUM_THREADS"] = max(1, torch.get_num_threads())
    return config


def single_threaded_torch(fn):
    """``fn`` with PyTorch limited to one thread while it runs (for graphs mixing both runtimes)."""
    def run(*args):
        n = torch.get_num_threads()
        if n == 1:
            return fn(*args)
        torch.set_num_threads(1)
        try:
            return fn(*args)
        finally:
            torch.set_num_threads(n)

    run.__wrapped__ = fn
    return run
