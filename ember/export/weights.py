"""The weights of an AOT package: one uncompressed zip entry, ``weights.bin``, read by memory mapping.

``aot_compile`` writes every weight's bytes (contiguous, in the wrapper's order) into ``weights.bin``,
each at a 64-byte aligned offset, and pads the entry's local zip header (an extra field of the id
zipalign uses) so that the entry's data starts at a 64-byte aligned offset of the package file too.
The manifest lists per weight its dtype, shape and offset (like a safetensors header).

``aot_load`` maps the package file copy-on-write (``mmap.ACCESS_COPY``) and views each weight in
place with ``torch.frombuffer``: nothing is read or copied at load time (pages come in when a
kernel first touches them), a buffer that ``forward`` mutates gets private pages, and the file on
disk never changes. Weights for CUDA are copied from the mapping to the GPU, once, with no
intermediate host copy. Only the standard library and torch are imported.
"""
from __future__ import annotations

import mmap
import struct
import zipfile

import torch

ENTRY = "weights.bin"
ALIGN = 64
_EXTRA_ID = 0xD935  # the extra-field id Android's zipalign pads with: zip readers skip it


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def write(zf: zipfile.ZipFile, tensors: list, entry: str = ENTRY) -> list:
    """Write ``tensors`` as the aligned ``entry`` of ``zf`` (opened for writing, stored); returns the
    manifest records: [{"dtype", "shape", "offset", "nbytes"}], offsets within the entry."""
    records, chunks, pos = [], [], 0
    for t in tensors:
        t = t.detach().contiguous().cpu()
        data = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        pad = -pos % ALIGN
        chunks += [b"\0" * pad, data]
        pos += pad
        records.append({"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "offset": pos, "nbytes": len(data)})
        pos += len(data)
    info = zipfile.ZipInfo(entry, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    # data starts after the 30-byte local header, the name and the extra field (ours, then the
    # 20-byte zip64 field zipfile appends for an entry past 2 GiB)
    zip64 = pos >= zipfile.ZIP64_LIMIT
    start = zf.fp.tell() + 30 + len(entry.encode()) + (20 if zip64 else 0)
    pad = -(start + 4) % ALIGN
    info.extra = struct.pack("<HH", _EXTRA_ID, pad) + b"\0" * pad
    with zf.open(info, "w", force_zip64=zip64) as f:
        for c in chunks:
            f.write(c)
    return records


def data_offset(path: str, entry: str = ENTRY) -> int:
    """Where ``entry``'s bytes start in the zip file at ``path`` (it must be stored uncompressed)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(entry)
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{path}: {entry} is compressed; rebuild the package with ember.export.aot_compile")
        with open(path, "rb") as f:
            f.seek(info.header_offset)
            header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def read(path: str, records: list, device: torch.device, entry: str = ENTRY) -> list:
    """The tensors of ``entry`` of the package at ``path``, viewed in a copy-on-write mapping of the
    file (moved to ``device`` if that is not the CPU)."""
    base = data_offset(path, entry)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    out = []
    for r in records:
        dtype = getattr(torch, r["dtype"])
        if r["nbytes"] == 0:
            t = torch.empty(r["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(mapped, dtype=torch.uint8, count=r["nbytes"], offset=base + r["offset"])
            t = t.view(dtype).view(r["shape"])
        out.append(t if device.type == "cpu" else t.to(device))
    return out
