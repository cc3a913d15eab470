"""ember's OpenVINO backends: ``openvino`` (ATen graphs through OpenVINO's FX frontend, partitioned) and
``openvino_ts`` (TorchScript tracing, then ``openvino.convert_model``). See docs/openvino.md.

Importing this package does not import openvino; the first compile does.
"""
from __future__ import annotations

from ember.backends.openvino.options import OpenVINOOptions, OpenVINOTSOptions
from ember.backends.registry import register_backend


def reports() -> list[dict]:
    """What the most recent graphs became, oldest first: per graph its OpenVINO partitions (their ops,
    cache hits), partitions that fell back to ember's native backend (and why), the ops left in
    PyTorch and the reason for each. The same text goes to ``EMBER_LOGS=openvino``."""
    from ember.backends.openvino.partition import REPORTS
    return list(REPORTS)


def clear_reports() -> None:
    from ember.backends.openvino.partition import REPORTS
    REPORTS.clear()


@register_backend(name="openvino", options=OpenVINOOptions)
def openvino(gm, example_inputs, options=None, mode=None):
    from ember.backends.openvino.backend import openvino_backend
    return openvino_backend(gm, example_inputs, options=options, mode=mode)


@register_backend(name="openvino_ts", options=OpenVINOTSOptions)
def openvino_ts(gm, example_inputs, options=None, mode=None):
    from ember.backends.openvino.ts import openvino_ts as compile_ts
    return compile_ts(gm, example_inputs, options=options, mode=mode)
