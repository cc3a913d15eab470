"""``model_caching``: converted partitions on disk, so a later process skips conversion and compilation.

Layout under ``cache_dir``::

    ember_openvino/ir/<hh>/<key>.xml, .bin   a converted partition (OpenVINO IR)
    ember_openvino/graphs/<key>.json        a whole graph that converted as one partition (see fastpath.py)
    ember_openvino/blobs/                   OpenVINO's own cache of compiled blobs (its CACHE_DIR property)

A partition's key hashes everything its OpenVINO model depends on: the partition's code, the shapes
and dtypes of its inputs (symbolic sizes by canonical name, ``d0, d1 ...``, and range), the bytes of
every constant baked into it (frozen weights), the options that change conversion or compilation, the
versions of OpenVINO and torch, and the source of this package (editing the converter invalidates old
entries). Files are written under a temporary name and renamed,
so a concurrent reader sees a whole file or none.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile

import torch
import torch.fx as fx

FORMAT = "ember-openvino-cache-1"


def root(cache_dir: str) -> str:
    return os.path.join(os.path.abspath(cache_dir), "ember_openvino")


def blob_dir(cache_dir: str) -> str:
    return os.path.join(root(cache_dir), "blobs")


@functools.lru_cache(maxsize=1)
def _package_source_hash() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + f.read())
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
    """The cached OpenVINO model for ``key``, or None."""
    xml = _ir_path(cache_dir, key)
    if not (os.path.exists(xml) and os.path.exists(xml[:-4] + ".bin")):
        return None
    try:
        return core.read_model(xml)
    except Exception:  # noqa: BLE001 - a truncated or foreign file: convert again and overwrite it
        return None


def save_model(model, cache_dir: str, key: str) -> None:
    import openvino as ov

    xml = _ir_path(cache_dir, key)
    folder = os.path.dirname(xml)
    os.makedirs(folder, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=folder, prefix=".tmp-")
    try:
        # keep weights in their dtype: compress_to_fp16 would change results
        ov.save_model(model, os.path.join(tmp, "m.xml"), compress_to_fp16=False)
        os.replace(os.path.join(tmp, "m.bin"), xml[:-4] + ".bin")  # .bin first: readers look for the .xml
        os.replace(os.path.join(tmp, "m.xml"), xml)
    finally:
        for name in os.listdir(tmp):
            os.remove(os.path.join(tmp, name))
        os.rmdir(tmp)


def _record_path(cache_dir: str, key: str) -> str:
    return os.path.join(root(cache_dir), "graphs", key + ".json")


def load_record(cache_dir: str, key: str) -> dict | None:
    try:
        with open(_record_path(cache_dir, key)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_record(cache_dir: str, key: str, record: dict) -> None:
    path = _record_path(cache_dir, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
