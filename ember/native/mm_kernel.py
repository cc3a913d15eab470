"""``ember_mm``: the tiled ``tl.dot`` matmul kernel of max-autotune's template (``autotune.MMTemplate``)
and of small matmuls (``small_mm.SmallMM``).

A module of its own that imports only Triton: the kernel-build worker processes (``build_worker``)
import it by file, under this module's name (part of Triton's cache key), without importing torch
or the ``ember`` package, so its builds can run there ahead of the first call like any generated
kernel's.
"""
import triton
import triton.language as tl


@triton.jit
def ember_mm(A, B, C, Bias, Pre, M, N, K: tl.constexpr, stride_ab, stride_am, stride_ak, stride_bb, stride_bk,
             stride_bn, stride_cb, stride_cm, stride_cn, stride_xb, stride_xm, stride_xn, alpha, beta,
             HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
             EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             GROUP_M: tl.constexpr, STORE_PRE: tl.constexpr = False):
    """C[b] = act(alpha * A[b] @ B[b] + beta * Bias[b]); program (tile, batch). With ``STORE_PRE``, the
    value before the activation is stored too, in ``Pre`` (laid out as C): what a training graph
    keeps for the activation's backward. Tiles are visited in groups of GROUP_M rows so neighbouring
    programs share B tiles in L2. K is a constexpr: shapes are static here, and the interpreter of
    Triton 3.6 cannot loop over a runtime bound under numpy 2."""
    pid = tl.program_id(0)
    bid = tl.program_id(1).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group = pid // width
    size = tl.minimum(grid_m - group * GROUP_M, GROUP_M)
    pid_m = group * GROUP_M + (pid % width) % size
    pid_n = (pid % width) // size
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + bid * stride_ab + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + bid * stride_bb + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:  # no tail along K: only the M/N edges need masks
            a = tl.load(a_ptrs, mask=rm[:, None] < M, other=0.0)
            b = tl.load(b_ptrs, mask=rn[None, :] < N, other=0.0)
        else:
            kleft = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < kleft), other=0.0)
            b = tl.load(b_ptrs, mask=(rk[:, None] < kleft) & (rn[None, :] < N), other=0.0)
        if UPCAST:  # the interpreter's dot mishandles bf16 (tests only; on a GPU bf16 feeds tensor cores)
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # epilogue hooks: scaling, bias, activation, then one rounding to the output dtype
    acc = acc * alpha
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_BIAS:
        bias = tl.load(Bias + bid * stride_xb + rm[:, None] * stride_xm + rn[None, :] * stride_xn, mask=mask, other=0.0)
        acc = acc + beta * bias.to(tl.float32)
    c_off = bid * stride_cb + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    if STORE_PRE:
        tl.store(Pre + c_off, acc.to(Pre.dtype.element_ty), mask=mask)
    if ACTIVATION == "relu":
        acc = tl.maximum(acc, 0.0)
    if ACTIVATION == "gelu":
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    tl.store(C + c_off, acc.to(C.dtype.element_ty), mask=mask)
