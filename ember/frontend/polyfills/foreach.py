"""``torch._C._group_tensors_by_device_and_dtype``, which torch's foreach code calls (through
``torch.utils._foreach_utils._group_tensors_by_device_and_dtype``: ``clip_grad_norm_``,
``clip_grad_value_``, optimizers' foreach paths outside a compiler) to batch the tensors of each
device and dtype. The C binding cannot run on the fake tensors of a trace (it is a graph break); this
is its Python equivalent (aten/src/ATen/native/ForeachUtils.h,
``_group_tensors_by_first_tensors_device_and_dtype``), which reads only devices and dtypes, known
while tracing. One difference no result sees: the C binding's groups come in its hash map's order,
these in the order of their first tensor (each group is worked on by itself).
"""
import torch

_STEP_DTYPES = (torch.float32, torch.float64)


def group_tensors_by_device_and_dtype(tensorlistlist, with_indices=False):
    if len(tensorlistlist) == 0 or len(tensorlistlist[0]) == 0:
        raise RuntimeError("Expected !nested_tensorlist[0].empty() to be true, but got false.")
    num_tensors = len(tensorlistlist[0])
    if not all(len(tl) == num_tensors or len(tl) == 0 for tl in tensorlistlist):
        raise RuntimeError("all the tensor lists must have the same length, or be empty")
    grouped = {}
    for i in range(num_tensors):
        first = tensorlistlist[0][i]
        if first is None:
            raise RuntimeError("Tensors of the first list of nested Tensor lists are supposed to be defined but "
                               f"the {i}-th Tensor is not.")
        key = (first.device, first.dtype)
        for tl in tensorlistlist:
            if len(tl) == 0 or tl[i] is None:
                continue
            t = tl[i]
            # a state_steps tensor may be float32/64 whatever the parameters' dtype, and on the CPU
            if t.device == key[0]:
                ok = t.dtype == key[1] or t.dtype in _STEP_DTYPES
            else:
                ok = t.device.type == "cpu" and t.dtype in _STEP_DTYPES
            if not ok:
                raise RuntimeError("Tensors of the same index must be on the same device and the same dtype except "
                                   "`step` tensors that can be CPU and float32/64 notwithstanding")
        if key not in grouped:
            grouped[key] = ([[] for _ in tensorlistlist], [])
        lists, indices = grouped[key]
        for j, tl in enumerate(tensorlistlist):
            if len(tl) != 0:
                lists[j].append(tl[i])
        if with_indices:
            indices.append(i)
    return grouped
