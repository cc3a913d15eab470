"""lower_ops.compute_dtype memoizes type promotion per argument class (a tensor's dtype and whether it
is 0-dim, a Python number's type, a size symbol): it must answer what promoting afresh answers."""
import torch


def test_compute_dtype_memo_matches_promotion():
    """lower_ops.compute_dtype memoizes per argument class: the same dtypes as promoting afresh,
    including what separates classes (0-dim tensors, Python number types, size symbols)."""
    import sympy
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
    from torch._prims_common import elementwise_dtypes

    from ember.native import lower_ops
    from ember.native.lowering import Lazy

    def val(dtype, sizes):
        return Lazy(sizes, dtype, "cpu", lambda idx: None)
    cases = [(val(torch.bfloat16, (4,)), 2.0), (val(torch.bfloat16, (4,)), 2), (val(torch.int64, (4,)), 2.0),
             (val(torch.int64, (4,)), val(torch.float32, ())), (val(torch.float16, (4,)), val(torch.float32, ())),
             (val(torch.float16, ()), val(torch.float32, ())), (val(torch.int32, (4,)), sympy.Symbol("s0")),
             (val(torch.bool, (4,)), True), (val(torch.bool, (4,)), 1)]
    lower_ops._DTYPES.clear()
    for kind in (KIND.DEFAULT, KIND.INT_TO_FLOAT, KIND.ALWAYS_BOOL):
        for args in cases + cases:  # (second pass: answered from the memo)
            fresh = elementwise_dtypes(*[lower_ops._proto(a) for a in args], type_promotion_kind=kind)[0]
            assert lower_ops.compute_dtype(args, kind) == fresh, (args, kind)
