"""``model_caching``: converted partitions on disk, so a later process skips conversion and compilation.

Layout under ``cache_dir``::

    ember_openvino/ir/<hh>/<key>.xml, .bin   a converted partition (OpenVINO IR)
    ember_openvino/ir/<hh>/<key>.sum        its seal: the SHA-256 of the .xml and the .bin, in an envelope
    ember_openvino/graphs/<key>.json        a whole graph that converted as one partition (see fastpath.py),
                                            in an envelope
    ember_openvino/blobs/                   OpenVINO's own cache of compiled blobs (its CACHE_DIR property)

A partition's key hashes everything its OpenVINO model depends on: the partition's code, the shapes
and dtypes of its inputs (symbolic sizes by canonical name, ``d0, d1 ...``, and range), the bytes of
every constant baked into it (frozen weights), the options that change conversion or compilation, the
versions of OpenVINO and torch, and the source of this package (editing the converter invalidates old
entries). Files are written under a temporary name and renamed,
so a concurrent reader sees a whole file or none.

Trust (``ember.diskcache``): directories are created 0700, and a tree that is not ours or is writable
by group or others is refused (warned about once): nothing is read from it or written to it, and
OpenVINO's blob cache moves to a private scratch directory. Records and seals are envelopes naming
the key they were built for, with a checksum; an IR is read from memory, from the bytes that match
its seal, so an IR or record copied under another key, truncated or edited is a miss, converted again
and replaced. (OpenVINO's compiled blobs are its own format, checked by OpenVINO; ember only makes
sure their directory is private.)
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile

import torch
import torch.fx as fx

from ember import diskcache

FORMAT = "ember-openvino-cache-1"


def root(cache_dir: str) -> str:
    return os.path.join(os.path.abspath(cache_dir), "ember_openvino")


def _usable(path: str, cache_dir: str, create: bool = True) -> bool:
    """``path`` (under ``root(cache_dir)``) exists (``create``) and the whole tree down to it is ours."""
    return diskcache.secure_dir(path, os.path.abspath(cache_dir), create)


def blob_dir(cache_dir: str) -> str:
    """OpenVINO's CACHE_DIR: ours, or this process's private scratch directory when ours is refused."""
    path = os.path.join(root(cache_dir), "blobs")
    return path if _usable(path, cache_dir) else diskcache.scratch_dir("openvino-blobs")


@functools.lru_cache(maxsize=1)
def _package_source_hash() -> str:
    h = hashlib.sha256()
    diskcache.hash_sources(h, os.path.dirname(os.path.abspath(__file__)))
    return h.hexdigest()


def tensor_digest(t: torch.Tensor, h) -> None:
    """Feed a tensor's metadata and bytes to hash ``h`` (blake2b reads ~1 GB/s: cheap next to converting)."""
    t = t.detach()
    h.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
    if t.numel():
        h.update(memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))


def _graph_text(gm: fx.GraphModule) -> str:
    """The graph as code, with constant tensors' contents hashed in (the code only names them)."""
    h = hashlib.blake2b(digest_size=32)
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor):
                h.update(node.target.encode())
                tensor_digest(value, h)
    return gm.code + "\n#constants " + h.hexdigest()


def partition_key(sub: fx.GraphModule, inputs: str, opts, ov_version: str) -> str:
    """``inputs``: the partition's input signature as text (``shapes.Signature.key_text``)."""
    h = hashlib.sha256()
    for part in (FORMAT, ov_version, torch.__version__, _package_source_hash(), opts.cache_fingerprint(),
                 inputs, _graph_text(sub)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _ir_path(cache_dir: str, key: str) -> str:
    return os.path.join(root(cache_dir), "ir", key[:2], key + ".xml")


def load_model(core, cache_dir: str, key: str):
    """The cached OpenVINO model for ``key``, or None (missing, refused, or not the one sealed)."""
    import numpy as np
    import openvino as ov

    xml = _ir_path(cache_dir, key)
    if not _usable(os.path.dirname(xml), cache_dir, create=False):
        return None
    seal = diskcache.read_entry(xml[:-4] + ".sum", "openvino-ir", key)
    if seal is None:
        return None
    try:
        want = json.loads(seal)
        parts = {}
        for ext in ("xml", "bin"):
            data = diskcache.read_file(f"{xml[:-4]}.{ext}")
            if data is None or diskcache.sha256(data) != want[ext]:
                raise diskcache.Refused(f"its .{ext} is missing or not the one sealed")
            parts[ext] = data
        weights = ov.Tensor(np.frombuffer(parts["bin"], dtype=np.uint8).copy())
        return core.read_model(parts["xml"].decode(), weights)
    except Exception as e:  # noqa: BLE001 - a damaged, foreign or swapped IR: convert again and overwrite it
        diskcache.warn_once("ignoring openvino-ir entry", xml, f"{type(e).__name__}: {e}", "it is converted again")
        return None


def save_model(model, cache_dir: str, key: str) -> None:
    import openvino as ov

    xml = _ir_path(cache_dir, key)
    folder = os.path.dirname(xml)
    if not _usable(folder, cache_dir):
        return
    tmp = tempfile.mkdtemp(dir=folder, prefix=".tmp-")
    try:
        # keep weights in their dtype: compress_to_fp16 would change results
        ov.save_model(model, os.path.join(tmp, "m.xml"), compress_to_fp16=False)
        seal = {}
        for ext in ("xml", "bin"):
            with open(os.path.join(tmp, f"m.{ext}"), "rb") as f:
                seal[ext] = diskcache.sha256(f.read())
            os.chmod(os.path.join(tmp, f"m.{ext}"), 0o600)
        os.replace(os.path.join(tmp, "m.bin"), xml[:-4] + ".bin")
        os.replace(os.path.join(tmp, "m.xml"), xml)
        # the seal last: a reader trusts the pair only once it matches
        diskcache.write_entry(xml[:-4] + ".sum", root(cache_dir), "openvino-ir", key, json.dumps(seal).encode())
    finally:
        for name in os.listdir(tmp):
            os.remove(os.path.join(tmp, name))
        os.rmdir(tmp)


def _record_path(cache_dir: str, key: str) -> str:
    return os.path.join(root(cache_dir), "graphs", key + ".json")


def load_record(cache_dir: str, key: str) -> dict | None:
    path = _record_path(cache_dir, key)
    if not _usable(os.path.dirname(path), cache_dir, create=False):
        return None
    return diskcache.read_json(path, "openvino-graph", key)


def save_record(cache_dir: str, key: str, record: dict) -> None:
    path = _record_path(cache_dir, key)
    diskcache.write_entry(path, os.path.abspath(cache_dir), "openvino-graph", key, json.dumps(record).encode())
