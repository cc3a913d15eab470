"""Probe (CUDA): a patchify convolution (stride == kernel, no padding: a ViT's patch embedding) as
cuDNN's convolution against the gather + one GEMM that ember's native pass ``patchify_conv``
(ember/native/patchify.py) makes of it. Times with CUDA events, median of 7 rounds of 20 calls:

  conv      eager F.conv2d (cuDNN: layout kernels + a convolution kernel)
  gemm      eager ATen spelling of the rewrite: crop, permute + contiguous (the gather), addmm
  ember     the patch embedding as the ViT uses it (conv, flatten(2).transpose(1, 2), class token,
            position embedding, layer norm) traced to ATen and compiled by ember's native backend
            (ember.native.compile_aten_graph), pass on ...
  ember-off ... and off (NativeOptions patchify_conv=False)
  eager_embed  the same patch embedding run by eager

and the largest error of each against eager's convolution relative to its largest value. Shapes:
ViT-B/16 and ViT-L/14 at 224 (batch 64), SigLIP-So400m/14 at 384 (batch 32: 384 = 27 * 14 + 6, the
convolution drops 6 rows and columns) and SigLIP-B/16 at 256 (batch 64), bf16; ViT-B/16 in fp32 with
TF32 matmuls off (eager's default: the pass leaves fp32 alone) and on. Under a minute on an H100:

    python benchmarks/probes/patchify_conv.py            # prints one row per case, then a JSON line
    python benchmarks/probes/patchify_conv.py --no-ember # conv against gemm only (no compiles)
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F

SHAPES = [  # name, batch, image, patch, width
    ("vit_b16_224", 64, 224, 16, 768),
    ("vit_l14_224", 64, 224, 14, 1024),
    ("siglip_so400m14_384", 32, 384, 14, 1152),
    ("siglip_b16_256", 64, 256, 16, 768),
]


def timed(fn, reps=20, rounds=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / reps)
    return statistics.median(ms), min(ms), max(ms)


def gemm(x, w, b, k):
    n, c, h, wd = x.shape
    oh, ow = h // k, wd // k
    p = x[:, :, :oh * k, :ow * k].reshape(n, c, oh, k, ow, k).permute(0, 2, 4, 1, 3, 5).reshape(n * oh * ow, -1)
    return torch.addmm(b, p, w.reshape(w.shape[0], -1).t()).view(n, oh, ow, -1).permute(0, 3, 1, 2)


def embed_fn(k):
    def embed(x, w, b, cls, pos):
        y = F.conv2d(x, w, b, stride=k).flatten(2).transpose(1, 2)
        y = torch.cat([cls.expand(x.shape[0], -1, -1), y], 1) + pos
        return F.layer_norm(y, (y.shape[-1],))
    return embed


def native(fn, args, patchify_conv):
    """fn traced to a functional ATen graph (as ember's autograd layer traces an inference graph)
    and compiled by the native backend with the pass on or off."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from ember.native import DECOMPOSITIONS, compile_aten_graph
    gm = make_fx(torch.func.functionalize(fn), decomposition_table=DECOMPOSITIONS,
                 tracing_mode="fake")(*args)
    compiled = compile_aten_graph(gm, list(args), options={"patchify_conv": patchify_conv})
    ops = compiled.ember_native["report"]["extern_ops"]
    assert ("aten.convolution.default" in ops) != (patchify_conv and args[0].dtype != torch.float32), ops
    return lambda *a: compiled(*a)


def rel(a, ref):
    a = a[0] if isinstance(a, (list, tuple)) else a
    return float((a.float() - ref.float()).abs().max() / ref.float().abs().max())


def main():
    with_ember = "--no-ember" not in sys.argv
    dev = "cuda"
    cases = [(name, n, img, k, width, torch.bfloat16, None) for name, n, img, k, width in SHAPES]
    cases += [("vit_b16_224", 64, 224, 16, 768, torch.float32, tf32) for tf32 in (False, True)]
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, n, img, k, width, dtype, tf32 in cases:
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.manual_seed(0)
        x = torch.randn(n, 3, img, img, device=dev, dtype=dtype)
        w = torch.randn(width, 3, k, k, device=dev, dtype=dtype) * 0.05
        b = torch.randn(width, device=dev, dtype=dtype)
        ref = F.conv2d(x, w, b, stride=k)
        row = {"case": name, "dtype": str(dtype).replace("torch.", ""), "tf32_matmul": tf32,
               "conv_ms": timed(lambda: F.conv2d(x, w, b, stride=k)),
               "gemm_ms": timed(lambda: gemm(x, w, b, k)), "gemm_err": rel(gemm(x, w, b, k), ref)}
        if with_ember:
            tokens = (img // k) ** 2 + 1
            cls = torch.randn(1, 1, width, device=dev, dtype=dtype)
            pos = torch.randn(1, tokens, width, device=dev, dtype=dtype)
            args = (x, w, b, cls, pos)
            eager_out = embed_fn(k)(*args)
            for label, on in (("ember", True), ("ember-off", False)):
                fn = native(embed_fn(k), args, on)
                row[f"{label}_err"] = rel(fn(*args), eager_out)
                row[f"{label}_ms"] = timed(lambda: fn(*args))
            row["eager_embed_ms"] = timed(lambda: embed_fn(k)(*args))
        rows.append(row)
        cols = [f"{key[:-3]} {v[0]:.3f} ms" for key, v in row.items() if key.endswith("_ms")]
        errs = [f"{key[:-4]} err {v:.1e}" for key, v in row.items() if key.endswith("_err")]
        print(f"{name:22s} {row['dtype']:8s} tf32={str(tf32):5s} " + "  ".join(cols) + "  |  " + "  ".join(errs))
    torch.backends.cuda.matmul.allow_tf32 = False
    print(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}))


if __name__ == "__main__":
    main()
