"""Warnings that point at the user's line, not at ember's.

A compiled callable is reached through ember's wrappers (``OptimizedModule.__call__``, the frame
cache, generated entry and resume functions) and often through ``torch.nn.Module.__call__``; a fixed
``stacklevel`` names one of those. ``warn_user`` walks out of them to the first frame of user code.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

_EMBER = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# generated code (entry functions, resume functions) has a pseudo file name in angle brackets
_GENERATED = ("<ember", "<eval_with_key>", "<frozen ")


def _is_machinery(filename: str) -> bool:
    return filename.startswith((_EMBER, _TORCH)) or filename.startswith(_GENERATED)


def user_stacklevel() -> int:
    """The ``stacklevel`` of the innermost frame outside ember, torch and generated code, for a
    ``warnings.warn`` called by the caller of this function."""
    frame = sys._getframe(2)  # the caller of the function that calls us: level 2 of its warn
    level = 2
    while frame is not None and _is_machinery(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 2


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's frame (filters and "once" registries key on it)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
