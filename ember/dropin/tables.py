"""What each piece of the torch.compile surface means under ``ember run``: the tables.

``DYNAMO_CONFIG``: ``torch._dynamo.config`` knobs a script sets -> the ember setting that honours it
(``Knob.field`` of ``ember.config``, or a session setting) or the one-line note said instead.
Knobs in neither table are accepted too (torch validates the name), with a generic note.

``DYNAMO_FUNCTIONS`` / ``COMPILER_FUNCTIONS``: the names ``ember run`` puts on ``torch._dynamo`` and
``torch.compiler`` (implemented in ``dropin/functions.py``). docs/dropin.md renders these tables.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Knob:
    field: str | None = None    # the ember.config field that takes the value
    session: str | None = None  # or a setting of the ember run session (dropin/session.py)
    note: str = ""              # what the notice says (mapped knobs: how it is honoured)


DYNAMO_CONFIG = {
    "cache_size_limit": Knob("recompile_limit", note="ember.config.recompile_limit"),
    "recompile_limit": Knob("recompile_limit", note="ember.config.recompile_limit"),
    "suppress_errors": Knob("suppress_errors", note="ember.config.suppress_errors"),
    "automatic_dynamic_shapes": Knob("automatic_dynamic", note="ember.config.automatic_dynamic"),
    "use_numpy_random_stream": Knob("use_numpy_random_stream", note="ember.config.use_numpy_random_stream"),
    "assume_static_by_default": Knob(session="assume_static_by_default",
                                     note="False: torch.compile(dynamic=None) compiles as dynamic=True"),
    "disable": Knob(session="disable", note="True: compiled functions run their original code "
                                            "(ember.set_stance('force_eager'))"),
    # accepted, with what ember does instead
    "capture_scalar_outputs": Knob(note="ember breaks the graph at .item() and runs it eagerly (same results)"),
    "capture_dynamic_output_shape_ops": Knob(note="ember breaks the graph at ops with data-dependent output "
                                                  "shapes (nonzero, unique, ...) (same results)"),
    "accumulated_cache_size_limit": Knob(note="ember limits recompiles per function only (recompile_limit)"),
    "accumulated_recompile_limit": Knob(note="ember limits recompiles per function only (recompile_limit)"),
    "inline_inbuilt_nn_modules": Knob(note="ember always traces into nn.Module code"),
    "verbose": Knob(note="ember's errors always carry the user's file and line; EMBER_LOGS=all logs more"),
    "optimize_ddp": Knob(note="ember does not split graphs at DDP bucket boundaries"),
    "specialize_int": Knob(note="ember specializes ints until one changes (automatic_dynamic)"),
    "specialize_float": Knob(note="ember specializes floats"),
    "dynamic_shapes": Knob(note="ember always supports dynamic shapes"),
    "error_on_recompile": Knob(note="see ember.set_stance('fail_on_recompile')"),
    "log_file_name": Knob(note="ember logs to stderr (EMBER_LOGS)"),
}

GENERIC_NOTE = "no ember equivalent; ignored"

# torch._dynamo name -> what ember run gives it (a one-line description for the docs)
DYNAMO_FUNCTIONS = {
    "config": "a proxy of torch's config: every setting is stored as torch stores it, and the knobs above "
              "also set ember's equivalent",
    "mark_dynamic": "ember.mark_dynamic (min/max honoured; specialize_on and hint_override noted and ignored)",
    "maybe_mark_dynamic": "ember.maybe_mark_dynamic",
    "mark_static": "ember.mark_static on a tensor; on an nn.Module, noted and ignored",
    "mark_static_address": "accepted, noted: no effect (ember's CUDA graphs copy inputs as needed)",
    "reset": "ember.reset",
    "explain": "ember.explain (backend eager): graph_count, graph_break_count, break_reasons, op_count, "
               "ops_per_graph, out",
    "disable": "ember.disable",
    "allow_in_graph": "ember.allow_in_graph",
    "substitute_in_graph": "ember.substitute_in_graph",
    "graph_break": "a function ember never traces: calling it inside compiled code breaks the graph",
    "is_compiling": "ember.is_compiling",
    "optimize": "optimize(backend, nopython=, dynamic=) -> a decorator compiling with ember.compile",
    "optimize_assert": "optimize_assert(backend, dynamic=) -> optimize(backend, nopython=True) "
                       "(torch._dynamo.testing.standard_test compiles with it)",
    "assume_constant_result": "accepted, noted: the function is called as usual (same results)",
}

COMPILER_FUNCTIONS = {
    "compile": "ember.compile (lenient inductor options; honours assume_static_by_default)",
    "set_stance": "ember.set_stance", "disable": "ember.disable", "reset": "ember.reset",
    "allow_in_graph": "ember.allow_in_graph", "substitute_in_graph": "ember.substitute_in_graph",
    "list_backends": "ember.list_backends",
    "cudagraph_mark_step_begin": "no-op: ember's CUDA graphs need no step marks",
    "keep_tensor_guards_unsafe": "ember.keep_tensor_guards_unsafe", "skip_all_guards_unsafe": "ember's",
    "skip_guard_on_all_nn_modules_unsafe": "ember's", "skip_guard_on_globals_unsafe": "ember's",
    "skip_guard_on_inbuilt_nn_modules_unsafe": "ember's",
}


def markdown_tables() -> str:
    """The tables of docs/dropin.md (a test keeps them identical)."""
    rows = ["| `torch._dynamo.config` knob | ember |", "|---|---|"]
    for name, k in DYNAMO_CONFIG.items():
        how = f"honoured: {k.note}" if (k.field or k.session) else f"accepted, noted: {k.note}"
        rows.append(f"| `{name}` | {how} |")
    rows.append(f"| any other knob | accepted, noted: {GENERIC_NOTE} |")
    rows += ["", "| `torch._dynamo.` name | under `ember run` |", "|---|---|"]
    rows += [f"| `{n}` | {d} |" for n, d in DYNAMO_FUNCTIONS.items()]
    rows += ["", "| `torch.` / `torch.compiler.` name | under `ember run` |", "|---|---|"]
    rows += [f"| `{n}` | {d} |" for n, d in COMPILER_FUNCTIONS.items()]
    return "\n".join(rows) + "\n"
