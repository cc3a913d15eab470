"""Which callables go into the graph, which are inlined, and which get special handling (data only).

- torch functions (``torch.*``, ``torch.nn.functional.*``, unbound Tensor methods...) become graph ops;
- Python functions elsewhere, including nn.Module methods in torch.nn.modules, are inlined;
- the ``SPECIAL`` table maps particular objects to dedicated trackers (grad-mode and autocast
  contexts, "am I compiling?" queries);
- user tables filled by the public API (ember/control.py): functions allowed into the graph whole
  (``allow_in_graph``), polyfills traced in place of C functions (``substitute_in_graph``),
  callables never traced (``disable``) and callables that must not run inside a compile
  (``set_stance``).
"""
from __future__ import annotations

import os
import sys
import types

import torch

# the tracker classes these rules make register themselves there (trace_rules sits below them)
from ember.frontend.variables.base import helpers, trackers

# modules whose callables are graph operations (not inlined)
_GRAPH_MODULES = (
    "torch", "torch.functional", "torch.nn.functional", "torch._C._nn", "torch._C._VariableFunctions",
    "torch._C._linalg", "torch._C._special", "torch._C._fft", "torch.special", "torch.linalg", "torch.fft",
    "torch.nn.init", "torch._tensor", "torch.random", "torch._C", "torch.amp.autocast_mode",
)


def is_torch_callable(fn) -> bool:
    mod = getattr(fn, "__module__", None)
    if mod is None:
        objclass = getattr(fn, "__objclass__", None)  # Tensor method descriptors
        return objclass is not None and objclass.__name__ in ("TensorBase", "Tensor")
    if mod in _GRAPH_MODULES:
        return True
    self_obj = getattr(fn, "__self__", None)
    return isinstance(self_obj, types.ModuleType) and self_obj.__name__.startswith("torch._C")


# C bindings of ``torch._C`` itself (not its op namespaces ``_nn``/``_linalg``/``_special``/``_fft``,
# whose functions go through the dispatcher) act on a tensor's raw storage or bookkeeping, not through
# an operator: on the fake tensors of a trace they read placeholders (``_data_address`` answers 0,
# ``_increment_version`` bumps a version the real tensor never sees), hand fake tensors back inside
# Python containers the graph cannot describe (``_group_tensors_by_device_and_dtype``: the caller got
# a FakeTensor), or launch device code on null pointers (``torch.cuda.jiterator``: an illegal memory
# access on the H100, found by the OpInfo sweep). Called with a tensor, such a binding is a graph
# break and runs eagerly, as torch.compile leaves them out of its graphs too.
def bypasses_dispatcher(fn) -> bool:
    """``fn`` is a ``torch._C`` binding outside the dispatcher, which must not see fake tensors."""
    return isinstance(fn, types.BuiltinFunctionType) and getattr(fn, "__module__", None) == "torch._C" \
        and fn.__name__ not in TYPE_ONLY_C_BINDINGS


# bindings that read only their arguments' types and answer a bool, which for a fake tensor is a plain
# tensor's answer (torch.overrides.has_torch_function*: inlined nn.Module code such as
# MultiheadAttention.forward asks it of its tensors)
TYPE_ONLY_C_BINDINGS = frozenset({"_has_torch_function", "_has_torch_function_unary", "_has_torch_function_variadic"})


def constant_result(result):
    """A SPECIAL factory: calls of the object answer ``result`` while tracing."""
    def make(value, source):
        return trackers.ConstantFunctionVariable(value, result)

    return make


def _grad_cls(value, source):
    return trackers.GradModeClassVariable(value)


def _autocast_cls(value, source):
    return trackers.AutocastClassVariable(value)


def _build_special() -> dict:
    table = {
        torch.no_grad: _grad_cls,
        torch.enable_grad: _grad_cls,
        torch.set_grad_enabled: _grad_cls,
        torch._C._set_grad_enabled: _grad_cls,  # (a graph op alone would not switch the mode the trace runs in)
        torch.autocast: _autocast_cls,
        torch.compiler.is_compiling: constant_result(True),
        torch.compiler.is_dynamo_compiling: constant_result(True),
        torch.compiler.is_exporting: constant_result(False),
        torch.jit.is_scripting: constant_result(False),
        torch.jit.is_tracing: constant_result(False),
        torch._C._get_tracing_state: constant_result(None),
        # nn.TransformerEncoderLayer / MultiheadAttention take a fused "fast path" in eval mode
        # without grad (torch._transformer_encoder_layer_fwd, _native_multi_head_attention). Those
        # ops have no fake/meta kernels, so tracing them fails (seen with torch 2.11 exporting a
        # ViT); the regular path computes the same attention from ops the graph understands.
        torch.backends.mha.get_fastpath_enabled: constant_result(False),
    }
    for name in ("is_fx_tracing", "is_fx_symbolic_tracing"):
        fn = getattr(torch.fx._symbolic_trace, name, None)
        if fn is not None:
            table[fn] = constant_result(False)
    for mod in (getattr(torch, "cpu", None), getattr(torch, "cuda", None)):
        amp = getattr(mod, "amp", None)
        if amp is not None and hasattr(amp, "autocast"):
            table[amp.autocast] = _autocast_cls
    return table


SPECIAL = _build_special()


def _autograd_apply(tx, cls_vt, args, kwargs):
    return helpers.apply_function(tx, cls_vt, args, kwargs)


# Python methods traced by a rule instead of their body: function -> rule(tx, self_vt, args, kwargs)
METHOD_RULES = {
    torch.autograd.Function.apply.__func__: _autograd_apply,
}
# Callables that a break leaves to run as plain Python rather than compiling them on their own:
# their bodies are machinery ember models through the rules above, not code it can trace.
NATIVE_CALLEES = {
    torch.autograd.Function.apply.__func__: True,
}


# Wrapper modules whose forward is distributed-training machinery (DDP's reducer bookkeeping, buffer
# broadcasts, hooks on the autograd graph): class -> the attribute holding the module they wrap. A
# call of one runs its forward as plain Python and compiles the wrapped module on its own, as
# torch.compile does (it skips DDP's forward and compiles the wrapped module's frame).
# The empty name: the module's own forward is compiled and its hooks run natively (FSDP2's
# fully_shard, whose forward hooks all-gather the parameters before and free them after).
# Classes are named by (module, class): a module not imported yet has no instances, and importing
# torch.distributed.fsdp costs as much as ember's own import.
WRAPPER_MODULES = {
    ("torch.nn.parallel.distributed", "DistributedDataParallel"): "module",
    ("torch.distributed.fsdp", "FSDPModule"): "",
}


def wrapped_module_attr(module) -> str | None:
    """The attribute holding the module that ``module`` (a wrapper of WRAPPER_MODULES) wraps ("" for
    its own forward), else None."""
    for (mod_name, cls_name), attr in WRAPPER_MODULES.items():
        cls = getattr(sys.modules.get(mod_name), cls_name, None)
        if cls is not None and isinstance(module, cls):
            return attr
    return None


def python_behind(value):
    """The Python function to trace in place of ``value``, or None: ``torch.jit.script`` keeps the
    function it compiled on the ScriptFunction, and tracing that gives the same tensor ops."""
    if isinstance(value, torch.jit.ScriptFunction):
        return getattr(value, "_torchdynamo_inline", None)
    # a plain function only: getattr on any other value may run its class's __getattr__ (a dict
    # subclass answering attributes from its items raises KeyError, not AttributeError)
    if isinstance(value, types.FunctionType) and \
            value.__qualname__ == "wrap_dunder_call_ctx_manager.<locals>.inner" and \
            value.__module__ == "torch._dynamo.external_utils":
        # torch._dynamo.dont_skip_tracing(fn) (e.g. the _guards_fn of ExportedProgram.module()): a
        # Dynamo config patch around fn, which concerns Dynamo only; trace fn itself
        cells = dict(zip(value.__code__.co_freevars, (c.cell_contents for c in value.__closure__ or ())))
        if type(cells.get("self")).__name__ == "DynamoConfigPatchProxy":
            return cells.get("func")
    return None


def method_rule(fn):
    return _lookup(METHOD_RULES, fn)


def runs_natively(fn) -> bool:
    # (a module has no __func__: the lookup would run nn.Module.__getattr__, which raises)
    return _lookup(NATIVE_CALLEES, fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__func__", fn)) is not None


def register_special(obj, factory) -> None:
    """Let another layer (e.g. the api's ``ember.is_compiling``) map an object to a tracker."""
    SPECIAL[obj] = factory


def special_callable(value):
    try:
        return SPECIAL.get(value)
    except TypeError:  # unhashable
        return None


# ---- tables filled by ember/control.py ---------------------------------------------------------
ALLOWED_IN_GRAPH: dict = {}   # fn -> True: a graph op, body not traced
POLYFILLS: dict = {}          # original -> (polyfill, can_constant_fold_through)
DISABLED: dict = {}           # fn -> reason: never traced (a graph break where called)
FORBIDDEN: dict = {}          # fn -> message: calling it while tracing is an error


def _lookup(table: dict, value):
    try:
        return table.get(value)
    except TypeError:  # unhashable
        return None


def allow_in_graph(fn) -> None:
    ALLOWED_IN_GRAPH[fn] = True


def is_allowed_in_graph(value) -> bool:
    return bool(_lookup(ALLOWED_IN_GRAPH, value))


def register_polyfill(original, polyfill, can_constant_fold_through: bool) -> None:
    POLYFILLS[original] = (polyfill, can_constant_fold_through)


def polyfill_of(value):
    return _lookup(POLYFILLS, value)


def mark_disabled(fn, reason: str) -> None:
    DISABLED[fn] = reason


# Functions of torch that are graph breaks by design, named by (module, qualified name): ember never
# imports torch._dynamo, and a program that calls them has imported it. ``torch._dynamo.graph_break()``
# is an empty function; traced, it would vanish, and torch.optim relies on the break it makes
# (``_use_grad_for_differentiable`` breaks after switching grad mode, so that the optimizer's graph
# is captured under that mode).
BREAKS_BY_NAME = {
    ("torch._dynamo.decorators", "graph_break"): "torch._dynamo.graph_break()",
}
# The wrappers ``torch._dynamo.disable`` and torch's own ``torch._disable_dynamo`` put around a
# function (``Optimizer.zero_grad``, ``Optimizer.load_state_dict``...): torch.compile runs the function
# uncompiled, and so does ember (a break; the call runs as Python). functools.wraps gives the wrapper
# the function's names, so it is known by its code: (file under torch's directory, code qualname).
_TORCH_DIR = os.path.dirname(torch.__file__)
BREAKS_BY_CODE = {
    (os.path.join(_TORCH_DIR, "_compile.py"), "_disable_dynamo.<locals>.inner"): "torch._disable_dynamo",
    (os.path.join(_TORCH_DIR, "_dynamo", "eval_frame.py"), "DisableContext.__call__.<locals>._fn"):
        "torch._dynamo.disable",
    (os.path.join(_TORCH_DIR, "_dynamo", "external_utils.py"),
     "get_nonrecursive_disable_wrapper.<locals>.nonrecursive_disable_wrapper"): "torch._dynamo.disable",
}


def disabled_reason(value):
    reason = _lookup(DISABLED, value)
    if reason is None and isinstance(value, types.FunctionType):
        reason = BREAKS_BY_NAME.get((value.__module__, value.__qualname__))
        if reason is None:
            code = value.__code__
            reason = BREAKS_BY_CODE.get((code.co_filename, getattr(code, "co_qualname", None)))
    return reason


def forbid(fn, message: str) -> None:
    FORBIDDEN[fn] = message


def forbidden_message(value):
    return _lookup(FORBIDDEN, value)
