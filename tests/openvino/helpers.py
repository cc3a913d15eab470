"""Helpers shared by the OpenVINO backend tests."""
import torch

F32 = {"config": {"INFERENCE_PRECISION_HINT": "f32"}}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in float64 (0 when both are all zeros)."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def ov_ops(report_list) -> set[str]:
    """Every op name that ran inside an OpenVINO partition, over the given reports."""
    return {op for r in report_list for p in r["partitions"] for op in p["ops"]}
