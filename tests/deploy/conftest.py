"""Shared setup of the deployment tests (TorchServe, diffusers): the repository root on sys.path,
so ``examples/`` (the served model, the tiny Stable Diffusion pipeline) imports as in the docs."""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
