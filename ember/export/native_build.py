"""Build the native part of an AOT package: ember's kernels, compiled, with their binaries
(Triton kernels for CUDA, or on CPU under Triton's interpreter; the C++ renderer's units for CPU).

Runs in a child process (``python -m ember.export.native_build WORKDIR DEVICE RENDERER``) with empty
ember and Triton caches of its own (in WORKDIR), so every kernel the package needs is compiled there
(the Triton binaries land in that Triton cache, the C++ ``.so`` files in that ember cache), whatever
this or another process compiled before:

1. load the exported program that ``package.aot_compile`` saved in WORKDIR (``program.pt2``);
2. retrace its ATen graph with the decompositions the "ember" backend gives the autograd layer;
3. compile it with ``ember.native.backend.compile_aten_graph`` (symbolic sizes stay kernel arguments:
   one wrapper and one set of kernels for every size the program's Dims allow; a graph the backend
   can only compile per size is an error here, naming why, not a package that compiles at load);
4. call it once on the example inputs, so Triton compiles every kernel into WORKDIR/triton_cache
   (or the C++ units are built into ``.so`` files);
5. write WORKDIR/native.json: the wrapper's path, its kernel files (and each C++ unit's ``.so``)
   and the graph's constants.

``package.aot_compile`` then zips the wrapper (kernel paths made relative), the kernel sources, the
``.so`` files and the Triton cache into the package; ``aot_runtime`` restores them, registers the
``.so`` files with ``cpp_build`` and points Triton at that cache, so loading compiles nothing.
"""
from __future__ import annotations

import json
import os
import sys


def retrace_for_native(ep, device: str):
    """(ATen graph decomposed for the native backend, its example inputs on ``device``)."""
    import torch
    import torch.utils._pytree as pytree
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch.export.graph_signature import InputKind

    from ember.aot.lazy_table import make_fx_lazy
    from ember.aot.ops import decomposition_table
    from ember.native.decomp import AOT_DECOMPOSITIONS

    gm = ep.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in placeholders]
    fake_mode = detect_fake_mode(vals)
    flat_user = pytree.tree_leaves(ep.example_inputs)
    real, k = [], 0
    for spec in ep.graph_signature.input_specs:
        if spec.kind is InputKind.USER_INPUT:
            real.append(flat_user[k].to(device) if isinstance(flat_user[k], torch.Tensor) else flat_user[k])
            k += 1
        else:
            v = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            real.append(v.detach().to(device))
    with fake_mode, enable_python_dispatcher():
        fakes = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
                 if isinstance(v, torch.Tensor) else v for v in vals]
        traced = make_fx_lazy(gm, decomposition_table(AOT_DECOMPOSITIONS))(*fakes)
    traced.graph._codegen = torch.fx.graph.CodeGen()
    out = next(n for n in reversed(traced.graph.nodes) if n.op == "output")
    flat = out.args[0]
    out.args = (tuple(flat) if isinstance(flat, (list, tuple)) else (flat,),)
    traced.recompile()
    return traced, real


def build(workdir: str, device: str, renderer: str = "triton") -> dict:
    import torch

    from ember.config import config
    from ember.native.backend import compile_aten_graph

    config.cache_dir = os.path.join(workdir, "ember_cache")  # empty: every kernel is generated and built here
    modules = os.path.join(workdir, "pytree_modules.json")
    if os.path.exists(modules):  # the output classes' modules register them with pytree (transformers')
        import importlib
        with open(modules) as f:
            for name in json.load(f):
                importlib.import_module(name)
    ep = torch.export.load(os.path.join(workdir, "program.pt2"))
    gm, real = retrace_for_native(ep, device)
    cpp = renderer == "cpp"
    # (Triton on CPU: the interpreter, for tests; C++: the default CPU path, asked for explicitly so
    # that EMBER_NATIVE_CPU in the environment does not change what the package holds)
    compiled = compile_aten_graph(gm, real, force_triton=device == "cpu" and not cpp,
                                  options={"cpu_codegen": "cpp"} if cpp else None)
    info = getattr(compiled, "ember_native", None) or {}
    if not info.get("wrapper"):
        raise RuntimeError(f"the native backend runs this graph as it is ({info.get('reason')}); no kernels to "
                           "package (aot_compile(..., kernels='aten') packages the ATen graph instead)")
    compiled(*real)  # every kernel is built now: Triton into this process's (empty) cache, C++ into .so files
    if device == "cuda":
        torch.cuda.synchronize()
    if info.get("reason"):  # a C++ unit the compiler refused: the graph would run its ATen code
        raise RuntimeError(f"building the kernels failed: {info['reason']}")
    constants = {t: getattr(gm, t).detach().cpu() for t in info.get("constants", [])}
    torch.save(constants, os.path.join(workdir, "native_constants.pt"))
    binaries = {}
    if cpp:
        from ember.native import cpp_build
        for path in info.get("kernels", []):
            if path.endswith(".cpp"):
                cpp_build.library(path)  # (built by the call above: this finds it)
                binaries[path] = cpp_build.binary_paths(path)[1]
    from ember.config import environment
    launches = compiled_launches(info["wrapper"], environment.get("TRITON_CACHE_DIR")) if device == "cuda" else {}
    record = {"wrapper": info["wrapper"], "kernels": info.get("kernels", []), "constants": list(constants),
              "binaries": binaries, "renderer": renderer, "sizes": info.get("sizes", ""), "launches": launches,
              "report": {k: v for k, v in (info.get("report") or {}).items() if isinstance(v, (int, float, str))}}
    with open(os.path.join(workdir, "native.json"), "w") as f:
        json.dump(record, f)
    return record


def compiled_launches(wrapper_path: str, cache_root: str | None) -> dict:
    """Per launch site of the wrapper (its ``launchN`` globals), the Triton kernel the example call
    compiled for it, as ``aot_runtime`` rebuilds it without Triton's JIT (``warm_launch.describe``)."""
    from ember.native.build_worker import module_name
    from ember.native.warm_launch import describe
    return describe(sys.modules.get(module_name(wrapper_path)), cache_root)


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cuda", sys.argv[3] if len(sys.argv) > 3 else "triton")
