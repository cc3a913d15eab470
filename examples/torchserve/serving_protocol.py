"""The request/response format shared by the handler and the client (TorchServe ships it in the .mar
with ``--extra-files``).

Request: the body is one float32 array of shape (N, 3, 32, 32), 1 <= N <= MAX_BATCH, as .npy bytes
(``numpy.save``), with ``Content-Type: application/octet-stream``. Response: JSON
``{"logits": [[...10 floats] * N], "ember": {...}}``; a request that breaks these rules gets HTTP 400
and ``{"error": "<what is wrong and what to send>"}``, and the server goes on serving.
"""
from __future__ import annotations

import io

import numpy as np

SAMPLE_SHAPE = (3, 32, 32)
DTYPE = np.float32
MAX_BATCH = 64
EXPECTED = f"one float32 array of shape (N, {', '.join(map(str, SAMPLE_SHAPE))}) with 1 <= N <= {MAX_BATCH}, as .npy bytes (numpy.save)"


class BadRequest(ValueError):
    """A request the handler refuses (HTTP 400): its message says what to send instead."""


def encode(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def decode(body) -> np.ndarray:
    """The request's array, checked; BadRequest naming the problem otherwise."""
    if isinstance(body, (dict, list, str)):
        raise BadRequest(f"the body was sent as JSON/text; send {EXPECTED} with Content-Type: application/octet-stream")
    if body is None or len(body) == 0:
        raise BadRequest(f"empty request body; send {EXPECTED}")
    try:
        array = np.load(io.BytesIO(bytes(body)), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the client's
        raise BadRequest(f"the body is not a .npy array ({type(exc).__name__}: {exc}); send {EXPECTED}") from None
    if array.dtype != DTYPE:
        raise BadRequest(f"wrong dtype {array.dtype}: expected float32 (array.astype(numpy.float32)); send {EXPECTED}")
    if array.ndim != 1 + len(SAMPLE_SHAPE) or array.shape[1:] != SAMPLE_SHAPE or not 1 <= array.shape[0] <= MAX_BATCH:
        raise BadRequest(f"wrong shape {tuple(array.shape)}; send {EXPECTED}")
    if not np.isfinite(array).all():
        raise BadRequest(f"the array holds NaN or infinite values; send {EXPECTED}")
    return array
