"""``NativeOptions``: the native code generator's settings, one typed object per compile.

``compile_aten_graph(options=...)`` turns the caller's dict into this object once (unknown keys and
bad values raise there, naming the field) and every step of the pipeline (passes, split_reduction,
scheduler, triton_emit, autotune, small_mm, the graph cache key) reads its attributes: each setting
has exactly one default, here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ember.backends.options import BackendOptions, option


@dataclass(frozen=True)
class NativeOptions(BackendOptions):
    backend: ClassVar[str] = "ember"

    max_xblock: int = option(4096, "largest block over a kernel's pointwise (x) dimension; tests lower it "
                                   "to exercise tails and loops", min=1)
    max_rblock: int = option(8192, "largest block over a reduction (r) dimension", min=1)
    persistent_rnumel: int = option(8192, "row reductions up to this many elements keep the row in registers",
                                    min=1)
    single_program_numel: int = option(1 << 16, "a kernel this small may run as one program (reduce across rows)",
                                       min=1)
    # 2 per SM of an H100: fewer programs than this leave SMs idle (split_reduction.py)
    split_reduction_programs: int = option(264, "a reduction running fewer programs than this, each reducing "
                                                "split_reduction_numel elements or more, becomes two kernels", min=1)
    split_reduction_numel: int = option(1 << 16, "see split_reduction_programs", min=1)
    # Triton kernels of strided reductions (BatchNorm statistics of channels-last activations):
    # many short chunks (split_reduction.py; measured by benchmarks/probes/outer_reduction.py)
    split_outer_outputs: int = option(1 << 16, "a strided reduction (kept dim contiguous) splits into chunks until "
                                               "its partial results number this many", min=1)
    split_outer_rows: int = option(256, "the least rows per chunk of a split strided reduction", min=2)
    fusion: bool = option(True, "fuse pointwise and reduction nodes into one kernel (False: one kernel per "
                                "realized node, for comparisons)")
    # a fusion past this size costs more to build than it saves at run time: on the H100 host Triton
    # took 4.9 s over one kernel of a 24-layer Llama's backward that recomputes the residual stream
    # and its 49 RMSNorm outputs (151 buffers; every sum stays live across the loop body: registers
    # spill), 2.0 s over the 24 rotary-embedded key outputs its forward fused into one kernel (49
    # buffers), each the critical path of its cold compile (benchmarks/results/
    # llama_buildtimes-h100-s40.json; counts: benchmarks/probes/fusion_size.py)
    max_fused_buffers: int = option(32, "largest number of distinct buffers (inputs and outputs) one fused kernel "
                                       "reads or writes; 0: no limit (compile_aten_graph fills it from "
                                       "ember.config.native_max_fused_buffers)", min=0)
    verify: bool = option(True, "run ir.verify on the lowered graph")
    cache: bool = option(True, "read and write the on-disk graph cache")
    cache_dir: str | None = option(None, "root of the on-disk caches (None: ember.config.cache_dir)", accepts=(str,))
    guard_inputs: bool = option(True, "check input sizes and strides per call (else run the graph as it is)")
    autotune: bool = option(False, "time launch configs and cuBLAS against a Triton matmul on the device "
                                   "(autotune.py; mode max-autotune)")
    cse: bool = option(True, "merge repeated pure ops before lowering (passes.py)")
    patchify_conv: bool = option(True, "convolutions with stride == kernel, no padding (a ViT's patch embedding) "
                                       "become a gather and one matmul where patchify.APPLY lists the device "
                                       "and dtype (patchify.py)")
    pad_mm: bool = option(True, "pad large matmuls with misaligned sizes for cuBLAS (pad_mm.py)")
    pad_mm_min_flops: int = option(1 << 30, "smallest matmul (FLOPs) pad_mm pads", min=0)
    # off by default: on the H100 cuBLAS runs GPT-2's logits mm (N = 50257, C's rows padded to 50264)
    # with an sm75 align1 CUTLASS kernel, 3.33 ms where the padded-weight path takes 0.45 ms + a 0.05 ms
    # pad kernel (GPT-2 inference 5.15 vs 2.35 ms per call: benchmarks/results/gpt2_infer_variants-h100-s39.md)
    pad_mm_rows: bool = option(False, "pad_mm: an mm misaligned only in N, its operands aligned, writes its "
                                      "result into rows padded apart (ember_native::mm_rows) instead of copying "
                                      "a padded weight (pad_mm.py); off by default: with it, cuBLAS picks a slow "
                                      "unaligned kernel for GPT-2's logits on the H100")
    sdpa_flash: bool = option(False, "CUDA inference attention that dispatched to cuDNN runs as FlashAttention-2 "
                                     "instead (cuDNN's op zeroes a philox seed and offset per call; slower on "
                                     "GPT-2 on the H100: 28.4 vs 18.5 us per layer; sdpa.py)")
    small_mm_flops: int = option(1 << 26, "mm/addmm up to this many FLOPs run as one Triton launch "
                                          "(small_mm.py); 0: never", min=0)
    packed_linear: bool = option(True, "CPU fp32 linear layers of a small batch whose weight is a graph input use MKL's "
                                       "packed GEMM (a large batch's Linear + ReLU/GELU: oneDNN's, the activation in "
                                       "its epilogue), the packed weight cached and re-packed when the weight changes "
                                       "(packed_linear.py); the ember backend's training forward graphs turn it off")
    release_inputs: bool = option(False, "the compiled function takes its inputs boxed (one list, which it empties) "
                                       "and drops each at its last use: the ember backend's backward graphs, "
                                       "whose saved activations then die as the backward consumes them")
    cpu_codegen: str = option("cpp", "CPU tensors: 'cpp' generates fused C++ kernels (cpp_emit.py; without a working "
                                     "compiler the ATen graph, logged once), 'aten' runs the ATen graph as it is "
                                     "(compile_aten_graph fills it from ember.config.native_cpu)")
    cpu_simd: str = option("auto", "C++ kernels: 'auto' writes fp32 row loops as explicit AVX-512 code where the CPU "
                                   "has avx512f (cpp_vector.py), 'portable' keeps scalar C++ only (compile_aten_graph "
                                   "fills it from ember.config.native_cpu_simd)")
    emulate_precision_casts: bool = option(False, "round fp16/bf16 casts inside fused kernels as eager rounds "
                                                  "each op (compile_aten_graph fills it from ember.config)")

    def cache_key(self) -> dict:
        """What of these options changes generated code (the graph cache key holds it): all but where
        the cache lives."""
        d = self.as_dict()
        d.pop("cache_dir")
        return d


def resolve(options=None) -> NativeOptions:
    """The options of one compile: ``options`` (dict, NativeOptions or None) over the defaults, with
    ``emulate_precision_casts`` from ``ember.config`` unless given."""
    if isinstance(options, NativeOptions):
        return options
    from ember.config import config
    given = dict(options or {})
    given.setdefault("emulate_precision_casts", config.emulate_precision_casts)
    given.setdefault("cpu_codegen", config.native_cpu)
    given.setdefault("cpu_simd", config.native_cpu_simd)
    given.setdefault("max_fused_buffers", config.native_max_fused_buffers)
    opts = NativeOptions.from_dict(given)
    if opts.cpu_codegen not in CPU_CODEGENS:
        raise ValueError(f"native option cpu_codegen={opts.cpu_codegen!r}: use one of {', '.join(CPU_CODEGENS)} "
                         "(or EMBER_NATIVE_CPU / ember.config.native_cpu)")
    if opts.cpu_simd not in CPU_SIMD:
        raise ValueError(f"native option cpu_simd={opts.cpu_simd!r}: use one of {', '.join(CPU_SIMD)} "
                         "(or EMBER_NATIVE_CPU_SIMD / ember.config.native_cpu_simd)")
    return opts


CPU_CODEGENS = ("aten", "cpp")
CPU_SIMD = ("auto", "portable")


# the defaults as a dict, for code written against the old DEFAULT_OPTIONS dict (read-only use)
DEFAULT_OPTIONS = NativeOptions().as_dict()
