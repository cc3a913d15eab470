"""Guard divergence across ranks: every rank must compile the same graphs in the same order.

Under ``torch.distributed`` the ranks of a data-parallel job run the same program, so they compile
the same graphs (the same recompiles too). A rank that recompiles where the others do not (its batch
had another length, a flag differed), or compiled another graph, will sooner or later issue other
collectives than its peers (another DDP bucket layout, FSDP2 all-gathers in another order) and the
job hangs in NCCL with nothing said. So each compile is described (``describe``: the compiled
callable, why it was compiled, the graph's ops, the DDP parts, the guards, with device indexes left
out) and the description is published in the process group's store under the process's compile
number; then it is compared with the peers' compile of the same number:

- ``config.distributed_check == "raise"``: the compiling thread waits (up to
  ``config.distributed_check_timeout`` seconds) for every peer's compile of that number and raises
  ``DivergentCompileError`` on a difference, or when a peer has not compiled it in time: naming the
  ranks, what each compiled and why, and the first difference, before the divergent graph's
  collectives run, instead of a hang;
- ``"warn"`` (the default): nothing waits; peers already there are compared at once, the others by a
  background thread once they arrive (or the timeout passes), and a difference is a warning;
- ``"off"``: nothing is published (a program whose ranks intentionally compile different code:
  pipeline stages, an evaluation on rank 0 only).

Only the first divergence is reported: after it the compile numbers no longer line up.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
import time

import torch

from ember.config import config
from ember.diagnostics import counters
from ember.diagnostics import logging as elog
from ember.diagnostics.userframe import warn_user
from ember.frontend.errors import DivergentCompileError

PREFIX = "ember/compile"
_DEVICE_INDEX = re.compile(r"\b(cuda|xpu|mps|hpu)(:\d+|', index=\d+\))")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+")
_lock = threading.Lock()
_seq = itertools.count(1)
_state = {"diverged": False, "generation": 0}


def _group():
    """(store, rank, world size) of the default process group, or None outside one."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception as exc:  # a process group without a store (a fake or custom one): nothing to compare
        elog.artifact("recompiles", f"ember: no store to compare compiles across ranks ({exc})")
        return None
    return store, dist.get_rank(), world


def _normal(text: str) -> str:
    """Device indexes (cuda:0, cuda:1) and object addresses in reprs differ between ranks without
    the graphs differing."""
    return _ADDRESS.sub("0x?", _DEVICE_INDEX.sub(r"\1", text))


def describe(name: str, entry, reason: str | None) -> list[str]:
    """What one compile produced, in lines that are equal on ranks that compiled alike."""
    lines = [f"compiled: {name}", f"why: {reason or 'first call'}"]
    gm = entry.graph
    if gm is not None:
        ops = [f"{n.op}:{getattr(n.target, '__name__', n.target)}" for n in gm.graph.nodes
               if n.op not in ("placeholder", "output")]
        digest = hashlib.sha1("\n".join(ops).encode()).hexdigest()[:12]
        compiled = entry.namespace.get("__graph")
        parts = getattr(compiled, "meta", {}).get("ember_split", {}).get("count", 1) if compiled is not None else 1
        lines.append(f"graph: {len(ops)} ops (ops hash {digest}), {parts} part(s), "
                     f"{sum(n.op == 'placeholder' for n in gm.graph.nodes)} inputs")
    else:
        lines.append("graph: none")
    for g in entry.guards:
        what = g.source.name() if g.source is not None else "global state"
        value = "" if g.kind.name in ("ID", "ALIAS", "NO_HOOKS") else f" = {g.expected!r}"[:160]
        lines.append(f"guard {g.kind.name} {what}{value}")
    return [_normal(ln) for ln in lines]


def after_compile(name: str, entry, reason: str | None) -> None:
    """Publish this compile and compare it with the peers' (see the module docstring)."""
    mode = config.distributed_check
    if mode == "off" or _state["diverged"]:
        return
    group = _group()
    if group is None:
        return
    store, rank, world = group
    with _lock:
        seq = next(_seq)
    lines = describe(name, entry, reason)
    record = json.dumps(dict(fp=hashlib.sha1("\n".join(lines).encode()).hexdigest(), lines=lines))
    store.set(_key(rank, seq), record)
    peers = [r for r in range(world) if r != rank]
    if mode == "raise":
        problem = _compare(store, rank, seq, record, peers, wait=True)
        if problem:
            _state["diverged"] = True
            counters.bump("distributed_divergence")
            raise DivergentCompileError(problem)
        return
    ready = [r for r in peers if store.check([_key(r, seq)])]
    problem = _compare(store, rank, seq, record, ready, wait=False)
    if problem:
        _report(problem)
    waiting = [r for r in peers if r not in ready]
    if waiting and not _state["diverged"]:
        threading.Thread(target=_watch, args=(store, rank, seq, record, waiting), daemon=True,
                         name=f"ember-divergence-{seq}").start()


def _key(rank: int, seq: int) -> str:
    return f"{PREFIX}/{_state['generation']}/{rank}/{seq}"


def _arrived(store, key: str, timeout: float) -> bool:
    """Poll (short non-blocking checks) rather than block in the store: a daemon thread must not sit
    inside a C++ call when the interpreter exits."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while not store.check([key]):
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(0.5, pause * 2)
    return True


def _watch(store, rank, seq, record, peers) -> None:
    try:
        problem = _compare(store, rank, seq, record, peers, wait=True)
    except Exception as exc:  # the process group went away (the job ended): nothing to report
        elog.artifact("recompiles", f"ember: compile comparison across ranks stopped ({exc})")
        return
    if problem:
        _report(problem)


def _report(problem: str) -> None:
    with _lock:
        if _state["diverged"]:
            return
        _state["diverged"] = True
    counters.bump("distributed_divergence")
    elog.artifact("recompiles", problem)
    warn_user(problem)


def _compare(store, rank: int, seq: int, record: str, peers: list, wait: bool) -> str | None:
    """The report of the first peer whose compile ``seq`` differs from ours (or, waiting, is missing)."""
    mine = json.loads(record)
    timeout = config.distributed_check_timeout
    for peer in peers:
        key = _key(peer, seq)
        if wait and not _arrived(store, key, timeout):
            return _missing(store, rank, seq, mine, peer, timeout)
        theirs = json.loads(store.get(key))
        if theirs["fp"] != mine["fp"]:
            return _differ(rank, seq, mine, peer, theirs)
    return None


def _differ(rank, seq, mine, peer, theirs) -> str:
    a, b = mine["lines"], theirs["lines"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    only_mine = [ln for ln in a if ln not in b][:4]
    only_theirs = [ln for ln in b if ln not in a][:4]
    return (f"ember: ranks {rank} and {peer} compiled different graphs (compile #{seq} of each rank), so their "
            f"collectives may no longer match (a hang).\n"
            f"  rank {rank}: {a[0]} ({a[1]}; {a[2] if len(a) > 2 else ''})\n"
            f"  rank {peer}: {b[0]} ({b[1]}; {b[2] if len(b) > 2 else ''})\n"
            f"  first difference: rank {rank} {a[first] if first < len(a) else '<nothing>'!r} vs rank {peer} "
            f"{b[first] if first < len(b) else '<nothing>'!r}\n"
            f"  only rank {rank}: {only_mine}\n  only rank {peer}: {only_theirs}\n" + _ADVICE)


def _missing(store, rank, seq, mine, peer, timeout) -> str:
    done = 0
    while store.check([_key(peer, done + 1)]):
        done += 1
    lines = mine["lines"]
    return (f"ember: rank {rank} compiled graph #{seq} ({lines[0]}; {lines[1]}) but rank {peer} has compiled only "
            f"{done} graph(s) after {timeout} s: rank {rank} runs code rank {peer} does not (a guard divergence), "
            f"so their collectives may no longer match (a hang).\n" + _ADVICE)


_ADVICE = ("  Make every rank see the same shapes and take the same branches (pad the last batch, mark a changing "
           "dimension dynamic), or, if the ranks are meant to compile differently (pipeline stages, an evaluation "
           "on one rank), set ember.config.distributed_check = 'off' (EMBER_DISTRIBUTED_CHECK=off).")


def reset() -> None:
    """Start numbering compiles again (tests; every rank must call it at the same point)."""
    global _seq
    with _lock:
        _seq = itertools.count(1)
        _state["diverged"] = False
        _state["generation"] += 1
