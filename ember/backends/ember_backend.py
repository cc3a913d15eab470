"""The default backend, ``ember`` (alias ``inductor``, so code written for torch.compile runs
unchanged): ember's autograd layer (ember/aot) traces each graph to ATen with its backward, and the
native code generator (ember/native) turns the ATen graphs into fused Triton kernels on CUDA and
fused C++ kernels on CPU tensors (``native_cpu='aten'``, or no working C++ compiler: the ATen graph
as it is).

Modes, as torch.compile names them (``MODES``):

- ``default``: the above; a small inference graph whose launches cost more host time than its
  kernels need on the device, or a training graph whose host time is near its device time,
  replays as a CUDA graph (``ember/cudagraphs/auto.py``,
  ``ember.config.auto_cudagraphs``);
- ``reduce-overhead``: each compiled forward, backward and inference graph replays as a CUDA graph
  (``ember/cudagraphs``), which removes the per-call Python and launch costs;
- ``max-autotune-no-cudagraphs``: kernels are tuned on the device at compile time
  (``ember/native/autotune.py``: block sizes and warps per kernel, cuBLAS against a Triton matmul);
- ``max-autotune``: both.

On CPU tensors neither applies (no CUDA graphs, nothing to tune): the graph compiles with the
default settings and a warning says so. The code generator's settings are ``NativeOptions``
(ember/native/options.py); a mode changes some of them (``native_options``).
"""
from __future__ import annotations

import functools

import torch

from ember.backends import inductor_options
from ember.backends.registry import register_alias, register_backend
from ember.diagnostics.logging import notice_once
from ember.diagnostics.userframe import warn_user

# mode -> (CUDA graphs, autotuning)
MODES = {
    None: (False, False), "default": (False, False),
    "reduce-overhead": (True, False),
    "max-autotune": (True, True),
    "max-autotune-no-cudagraphs": (False, True),
}
_native: dict = {}


def native_options(cudagraphs: bool, autotune: bool) -> dict:
    """What a mode changes of the native compiler's options (``NativeOptions`` defaults fill the rest;
    ``compile_aten_graph`` resolves them, with ``ember.config``, at each graph's compile)."""
    options = {}
    if autotune:
        options["autotune"] = True
    if cudagraphs:
        # a replayed graph launches nothing from Python, so SmallMM's saving (CPU time per call)
        # is gone and its device time is what counts: cuBLAS is faster there (batch-32 MLP on an
        # H100: its three matmuls take 51 us of device time as SmallMM, 25 us as cuBLAS, by
        # benchmarks/probes/step_profile.py mlp ember|eager)
        options["small_mm_flops"] = 0
    return options


def _native_backend(cudagraphs: bool = False, autotune: bool = False, overrides: tuple = ()):
    """``overrides``: (NativeOptions field, value) pairs from inductor options (``inductor_options``)."""
    key = (cudagraphs, autotune, overrides)
    if key not in _native:  # imported on first use: the ATen tracing and codegen stack is heavy
        from ember.aot import aot_autograd
        from ember.native import compile_aten_graph
        from ember.native.decomp import AOT_DECOMPOSITIONS

        compiler, options = compile_aten_graph, {**native_options(cudagraphs, autotune), **dict(overrides)}
        if options:
            compiler = functools.partial(compile_aten_graph, options=options)
            compiler.__name__ = "compile_aten_graph_" + "_".join(sorted(options))
        inference = forward = compiler
        if not cudagraphs:  # a training forward's weights change every step: packing them would not pay
            forward = functools.partial(compile_aten_graph, options={**options, "packed_linear": False})
            forward.__name__ = "compile_aten_graph_forward"
        backward = functools.partial(compile_aten_graph, options={**options, "release_inputs": True})
        if cudagraphs:
            from ember.cudagraphs import wrap_compiler
            compiler = inference = forward = backward = wrap_compiler(compiler)
        else:  # host-bound graphs may replay as CUDA graphs all the same (ember.config.auto_cudagraphs)
            from ember.cudagraphs.auto import wrap_auto
            inference = wrap_auto(compiler)
            forward = wrap_auto(forward, training=True)
            # a replayed backward is called unboxed (its buffers are the pool's); otherwise boxed
            backward = wrap_auto(backward, training=True, finish=_boxed_form)
        for c in {id(c): c for c in (inference, forward, backward)}.values():
            c.ember_before_trace = _start_builds
        _native[key] = aot_autograd(fw_compiler=forward, bw_compiler=backward, inference_compiler=inference,
                                    decompositions=AOT_DECOMPOSITIONS)
    return _native[key]


def _start_builds(gm, example_inputs) -> None:
    """Called by the autograd layer before it traces a graph (a miss of its cache): a graph of CUDA
    tensors will have Triton kernels to build, so the build workers start now and import Triton
    while the graph is traced (``runtime.want_builds``; otherwise they would start only when its
    kernels are generated, seconds later, and the first builds would wait for them)."""
    if _on_cuda(gm, example_inputs):
        from ember.native import runtime
        runtime.want_builds()


def _boxed_form(fn):
    """For backward graphs (compiled with native option ``release_inputs``): the compiled wrapper's
    boxed form (``run(args)``, which empties the list it is given), so each saved activation dies at
    its last use inside the backward instead of living until the backward returns (the autograd
    layer passes the saved tensors boxed and drops its own references first). A compiled function
    without a boxed form is returned as it is."""
    run = getattr(fn, "boxed", None)
    if run is None:
        return fn
    run.ember_native = fn.ember_native
    return run


def _cpu_backend():
    """The autograd layer alone, for graphs of CPU tensors: no code generator runs them, so they are
    traced without the Triton decompositions and eager's fused CPU kernels run (softmax and
    layer_norm split into their pieces cost 1.5x to 7x more, one ATen call each)."""
    if "cpu" not in _native:
        from ember.aot import aot_autograd, run_graph_eagerly
        _native["cpu"] = aot_autograd(fw_compiler=run_graph_eagerly)
    return _native["cpu"]


def _no_cpp_compiler() -> bool:
    """Known to have no working C++ compiler (not waiting for a check in flight: the graph then goes
    the C++ way, whose first call runs the ATen graph if the check fails; ``cpp_graph``)."""
    from ember.native import cpp_build
    return cpp_build.problem(wait=False) is not None


def _on_cuda(gm, example_inputs) -> bool:
    if any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs):
        return True
    return any(isinstance(v, torch.Tensor) and v.device.type == "cuda"
               for v in (n.meta.get("val") for n in gm.graph.nodes))


@register_backend(name="ember", options=inductor_options.TABLE)
def ember_default(gm, example_inputs, mode=None, options=None):
    cudagraphs, autotune = MODES.get(mode, (False, False))
    if (cudagraphs or autotune) and not _on_cuda(gm, example_inputs):
        # correct results, just not the mode's extra speed: say so instead of pretending
        what = " and ".join(w for w, on in (("CUDA graphs", cudagraphs), ("kernel autotuning", autotune)) if on)
        warn_user(f"ember: mode={mode!r} has no effect on CPU tensors ({what} need CUDA tensors); "
                  "the graph compiles with the default settings")
        cudagraphs = autotune = False
    tr = inductor_options.translate(options)  # torch.compile's inductor option names (validated)
    if not _on_cuda(gm, example_inputs):
        if tr.cudagraphs or tr.autotune:  # as torch.compile on CPU: accepted, said once
            notice_once("inductor-options-cpu", "inductor options for CUDA graphs or autotuning have no effect on "
                                                "CPU tensors; those graphs compile with the default settings")
    else:
        cudagraphs = cudagraphs if tr.cudagraphs is None else tr.cudagraphs
        autotune = autotune if tr.autotune is None else tr.autotune
    if not _on_cuda(gm, example_inputs):
        from ember.config import config
        # forced Triton: the kernels run in the interpreter (tests); native_cpu='cpp' (the default):
        # C++ kernels, unless no working compiler is found (checked once; a warning says it once)
        if not config.native_force_triton and (config.native_cpu != "cpp" or _no_cpp_compiler()):
            return _cpu_backend()(gm, example_inputs)
    return _native_backend(cudagraphs, autotune, tuple(sorted(tr.native.items())))(gm, example_inputs)


def _prewarm():
    """What the first kernel launch of a process waits for (cuBLAS, Triton's driver): started in the
    background when a function is compiled on a machine with a GPU, so it overlaps the frontend's
    work (``runtime.prewarm_triton``; the build workers start at the first graph generated, Triton's
    cache key when a frame is traced: ``_prewarm_trace``)."""
    if torch.cuda.is_available():
        from ember.native import runtime
        runtime.prewarm_cuda()
        runtime.prewarm_triton(runtime.compile_threads())


def _prewarm_trace():
    """Started when the frontend begins tracing a frame (not at decoration: a warm start, whose
    frames come from the frontend's cache, traces none). With a GPU: Triton's cache key, which the
    first kernel build waits for (``runtime.prewarm_triton_key``). On CPU: the C++ compiler's check
    (``cpp_build.probe_in_background``), which the first CPU graph would otherwise wait for before
    its AOT trace. Either then overlaps the frontend's trace."""
    from ember.config import config
    if torch.cuda.is_available():
        from ember.native import runtime
        runtime.prewarm_triton_key()
        return
    if config.native_cpu != "cpp" or config.native_force_triton:
        return
    from ember.native import cpp_build
    cpp_build.probe_in_background()


ember_default.prewarm = _prewarm
ember_default.prewarm_trace = _prewarm_trace
register_alias("inductor", "ember")
