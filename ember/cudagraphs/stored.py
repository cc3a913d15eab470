"""Measured CUDA-graph decisions, stored with the compiled graph's cache entry, so that a process
starting from the cache takes the decision the compiling process measured instead of measuring again.

Why: a measurement is three calls right after a compile or a cache load, and what else runs then
differs between the two processes: the compiling one has just made a large heap (its first full
garbage collection comes in its first steady calls: 306 ms and 544 ms for gpu_suite's overhead and
mlp rows on a 2-core CPU, ``benchmarks/results/warm_cold-cpu-s39.json``), a warm one may still be loading (its Triton prewarm thread,
lazily loaded libraries). Near the threshold the two measured different sides of it: ResNet-50
inference on the H100 (gpu_suite session 38) ran as compiled in the compiling process (host 1794 us,
device 3190 us) and replayed in the warm one (host 2997 us, device 3376 us). Two processes running
the same cached code must run it the same way; the first measurement decides for both.

What identifies a decision: the native graph's cache key (``ember_native["key"]``: its ATen graph,
input layouts, options and compiler versions), the device's name and compute capability, the host's
CPU model (host time is a property of the host: a cache directory copied to another kind of machine
measures again), and the rule's measuring parameters (``Rule.measured_host_fraction``,
``Rule.measure_calls``). A graph without a cache key (the cache is off, or not a native graph) is
measured in every process, as before. The entry is a small JSON file next to the graph's record
(``<cache>/native/graphs/<k>/<key>.cudagraph-<id>.json``), written and read through
``ember.diskcache`` (checked envelope, owner and mode checks, atomic replace).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform

from ember import diskcache

_KIND = "cudagraph-decision"


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The host's CPU model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _where(fn, api, device, rule):
    """(path, root, key) of ``fn``'s stored decision, or None: not a graph of the cache, or a graph API
    that does not name its device."""
    info = getattr(fn, "ember_native", None)
    key = info.get("key") if isinstance(info, dict) else None
    name = getattr(api, "device_name", None)
    if not key or name is None or device is None:
        return None
    try:
        dev = name(device)
    except Exception:  # noqa: BLE001 - a device that does not say what it is: measured each time
        return None
    ident = json.dumps(dict(graph=key, device=dev, cpu=cpu_model(), fraction=rule.measured_host_fraction,
                            calls=rule.measure_calls), sort_keys=True)
    dk = hashlib.sha256(ident.encode()).hexdigest()
    from ember.native import cache
    root = cache.root(info.get("cache_dir"))
    return os.path.join(root, "graphs", key[:2], f"{key}.cudagraph-{dk[:24]}.json"), root, dk


def load(fn, api, device, rule) -> dict | None:
    """The decision stored for ``fn`` on ``device`` under ``rule``: {"replay", "why", "samples",
    "device", "cpu"}, or None (none stored, or an entry not to trust: logged once, measured again)."""
    where = _where(fn, api, device, rule)
    if where is None or not os.path.exists(where[0]):
        return None
    payload = diskcache.read_entry(where[0], _KIND, where[2])
    try:
        rec = json.loads(payload) if payload is not None else None
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("replay"), bool) or not isinstance(rec.get("why"), str):
        return None
    return rec


def store(fn, api, device, rule, replay: bool, why: str, samples: list) -> bool:
    """Store a measured decision for the next process (False: not stored, the cache is off or refused)."""
    where = _where(fn, api, device, rule)
    if where is None:
        return False
    try:
        dev = api.device_name(device)
    except Exception:  # noqa: BLE001 - (answered in _where already)
        dev = None
    rec = dict(replay=replay, why=why, samples=[list(s) for s in samples], device=dev, cpu=cpu_model())
    return diskcache.write_entry(where[0], where[1], _KIND, where[2], json.dumps(rec).encode())
