"""One typed options object for ember, readable from ``EMBER_*`` environment variables.

Every field documents itself; ``ENV_TABLE`` (derived from the fields) is the table the docs show.
Deep code receives the values it needs; it does not read environment variables itself.

Every value is checked where it is set (``Config.__setattr__``, which the dataclass ``__init__``
goes through too): a typo'd name, a wrong type or an out-of-range value raises at the assignment or,
for ``EMBER_*`` variables, at ``import ember``, naming the variable, never later and never silently.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field

from ember.diagnostics.artifacts import ARTIFACTS, unknown_artifacts

# the spellings an EMBER_* boolean accepts (any case); anything else is an error, not False
BOOL_SPELLINGS = {"1": True, "true": True, "yes": True, "on": True,
                  "0": False, "false": False, "no": False, "off": False}


def _env_name(name: str) -> str:
    return "EMBER_" + name.upper()


def _check_logs(value: str) -> str | None:
    unknown = unknown_artifacts(value)
    if not unknown:
        return None
    close = difflib.get_close_matches(unknown[0], ARTIFACTS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"names unknown log artifact(s) {', '.join(map(repr, unknown))}{hint}; valid: "
            f"{', '.join(ARTIFACTS)}, or 'all' (comma-separated)")


def _check_nice(value: int) -> str | None:
    return None if 0 <= value <= 19 else "must be 0..19 (a niceness added to the process's own)"


def _check_native_cpu(value: str) -> str | None:
    return None if value in ("aten", "cpp") else "must be 'aten' or 'cpp'"


def _check_native_cpu_simd(value: str) -> str | None:
    return None if value in ("auto", "portable") else "must be 'auto' or 'portable'"


def _check_distributed_check(value: str) -> str | None:
    return None if value in ("off", "warn", "raise") else "must be 'off', 'warn' or 'raise'"


def _check_nonempty(value: str) -> str | None:
    return "must not be empty (leave it unset for the default)" if not value.strip() else None


# metadata keys: "doc" (the docs table), "min" (smallest int allowed), "check" (value -> problem or None)
@dataclass
class Config:
    recompile_limit: int = field(default=8, metadata={"doc": "cache entries per compiled function before further misses run eagerly", "min": 1})
    automatic_dynamic: bool = field(default=True, metadata={"doc": "with dynamic=None, a dimension (or int argument) whose value changed between calls becomes symbolic at the recompile (False: one compile per size, as dynamic=False; torch._dynamo.config.automatic_dynamic_shapes)"})
    size_oblivious_ones: bool = field(default=True, metadata={"doc": "a dimension that had size 1 at an earlier compile and becomes symbolic is traced size-obliviously (range [1, inf), torch's backed_size_oblivious), so the dynamic graph also serves size 1 where the program does not depend on it being 1: a batch sweep from 1 recompiles once, not twice (False: sizes 0 and 1 always specialize)"})
    inline_depth_limit: int = field(default=48, metadata={"doc": "deepest chain of inlined user calls before tracing gives up", "min": 1})
    instruction_limit: int = field(default=2_000_000, metadata={"doc": "bytecode instructions one trace may interpret (guards against endless loops)", "min": 1})
    logs: str = field(default="", metadata={"doc": "comma list of log artifacts: graph_breaks, recompiles, guards, graph_code, output_code, aot_graphs, cudagraphs, openvino, bytecode (or all)", "check": _check_logs})
    verify: bool = field(default=False, metadata={"doc": "run torch.fx Graph.lint() on every captured graph"})
    suppress_errors: bool = field(default=False, metadata={"doc": "a backend that fails to compile a graph: warn once and run the calls that graph would serve eagerly, instead of raising ember.BackendCompilerFailed (the suppress_errors switch of torch.compile)"})
    compile_gc_freeze: bool = field(default=True, metadata={"doc": "while a compile runs, the objects that existed before it are frozen (gc.freeze) and full collections are put off; at its end one full collection walks only the compile's own objects, then they are unfrozen (ember/frontend/convert.py): the full collection a compile's garbage caused walked the whole process (~0.4 s with a 1B Llama). Off: full collections are still put off during the compile, and the next one after it walks everything"})
    optimize_ddp: bool = field(default=True, metadata={"doc": "graphs compiled inside a DistributedDataParallel forward are split at DDP's gradient-bucket boundaries (ember/distributed), so each bucket's all-reduce starts while the rest of the backward runs (the optimize_ddp switch of torch.compile)"})
    regional_ddp: bool = field(default=True, metadata={"doc": "a graph compiled inside a DistributedDataParallel forward whose module calls repeat (the layers of a ModuleList) is split at those blocks instead of at DDP's buckets, each distinct block compiled once and shared (ember/backends/regional.py): every block's backward is its own autograd node, so DDP's all-reduces start as each block's backward ends, and the compile costs one layer, not all. Needs optimize_ddp; per compile options={'regional': False} opts out (then the bucket split)"})
    use_numpy_random_stream: bool = field(default=False, metadata={"doc": "np.random calls inside compiled code: False traces them into the graph on torch's random stream (np.random.seed is torch.manual_seed; the numbers differ from NumPy's), as torch.compile does; True makes them graph breaks that run NumPy itself, on NumPy's own stream (torch._dynamo.config.use_numpy_random_stream). Read when a function is compiled"})
    distributed_check: str = field(default="warn", metadata={"doc": "under torch.distributed, compare each compile (graph, guards, why it was compiled) with the other ranks' compile of the same number, through the process group's store: 'warn' warns once when a rank compiled differently (a guard divergence, which would make the ranks' collectives disagree and hang), 'raise' waits for the peers after each compile and raises ember.DivergentCompileError before the divergent graph runs, 'off' compares nothing (ranks that compile different code on purpose: pipeline stages) (ember/distributed/divergence.py)", "check": _check_distributed_check})
    distributed_check_timeout: int = field(default=120, metadata={"doc": "seconds distributed_check waits for the other ranks' compile of the same number before reporting that they did not compile it", "min": 1})
    native_force_triton: bool = field(default=False, metadata={"doc": "run the native backend's Triton kernels on CPU tensors too (needs TRITON_INTERPRET=1 before triton is imported; for tests)"})
    native_extern_check: bool = field(default=True, metadata={"doc": "native backend: the first call of each compiled graph compares what every extern call (an ATen or custom op the backend calls rather than generates code for) returns with the dtype, sizes, strides and device its fake/meta function promised and the generated code was planned with; on a mismatch it logs the op and both layouts, counts an eager fallback and runs the graph's ATen code for that call (from the original inputs) and every later one. Later calls run no check (ember/native/extern_check.py). False: extern results are trusted (a lying meta function then gives wrong results silently)"})
    native_cpu: str = field(default="cpp", metadata={"doc": "native backend on CPU tensors: 'cpp' generates fused C++/OpenMP kernels built with the system compiler (without a working one: a warning, once, and 'aten'), 'aten' runs the captured ATen graph (eager's kernels)", "check": _check_native_cpu})
    native_cpu_simd: str = field(default="auto", metadata={"doc": "native backend's C++ kernels: 'auto' writes the hot row loops of fp32 reductions as explicit AVX-512 code where the CPU has avx512f (several accumulators, vscalefps exp, division-free erf: ember/native/cpp_vector.py), 'portable' keeps every loop scalar C++ that the compiler vectorizes (other CPUs always get that)", "check": _check_native_cpu_simd})
    native_cpu_malloc: bool = field(default=True, metadata={"doc": "native backend's C++ path on glibc: at its first CPU graph, fix malloc's mmap threshold at 32 MiB and trim threshold at 64 MiB (the values glibc's own dynamic rule reaches at its cap), so tensors a call frees are reused by the next call instead of being returned to the OS and page-faulted back in (a training step's gradients: 110-175 faults per step on cpu_suite's mlp_train row; ember/native/cpu_heap.py). Up to 64 MiB of freed memory stays mapped. False, or malloc set by the user (MALLOC_*_ variables, glibc.malloc tunables): malloc is left alone"})
    native_max_fused_buffers: int = field(default=32, metadata={"doc": "native backend: the most distinct buffers (inputs and outputs) one fused Triton or C++ kernel may read or write; a fusion past it is not made: such a kernel costs more to build than it saves (on the H100 host Triton took 4.9 s over a 24-layer Llama's backward kernel of 151 buffers, 2.0 s over its forward's of 49, each the critical path of a cold compile: benchmarks/results/llama_buildtimes-h100-s40.json; ember/native/scheduler.py). 0: no limit", "min": 0})
    emulate_precision_casts: bool = field(default=False, metadata={"doc": "native backend: round fp16/bf16 casts inside fused kernels as eager rounds each op's result (off: computed in fp32 until stored, like torch.compile; closer to exact, faster)"})
    compile_threads: int = field(default=0, metadata={"doc": "native backend: Triton kernel builds at once, in worker processes, before a graph's first call (0: one per CPU core, up to 16; 1: no workers, each kernel built at its first launch)", "min": 0})
    build_nice: int = field(default=5, metadata={"doc": "native backend, Linux: niceness added to the kernel builds that run beside the process (Triton build workers, C++ compiler runs in the build threads), so a build for a graph not called yet (a backward while the forward runs) takes a core from the process's own calls only where one is idle (a compiling process's steady calls were slower than a warm one's while it built: benchmarks/probes/warm_cold.py); 0: same priority as the process", "check": _check_nice})
    regional_compile: bool = field(default=False, metadata={"doc": "compile each distinct repeated block of a graph (the layers of a ModuleList) once and share the compiled code, with weights as inputs, across its calls and across graphs (ember/backends/regional.py): compile time stops growing with depth; an inference graph on a GPU replays whole as one CUDA graph (GPT-2 within 2.2% of whole-model steps on an H100: benchmarks/results/regional_compile-gpt2-h100-s44.json), but a training step pays a few Python frames per block and loses fusion across block boundaries (docs/architecture.md), so off by default for every graph (blocks as large as regional_auto_block_params are compiled regionally anyway). On for every graph: EMBER_REGIONAL_COMPILE=1, or per compile options={'regional': True}"})
    regional_auto_block_params: int = field(default=0, metadata={"doc": "with regional_compile off and no per-compile 'regional' option, a training graph whose repeated block holds at least this many parameter elements and is called at least 8 times (a 1B-parameter Llama's layer holds 44M; GPT-2's and BERT-base's 7M) is compiled regionally anyway (not under an initialized torch.distributed; ember/backends/regional.py). 0 (the default): never automatically, because on the H100 the 1B Llama's training step ran 1.20x slower regional than whole (host-bound: benchmarks/results/regional_compile-llama-train-h100.json) though it compiled 2.5x faster; 16000000 turns it on for such models. options={'regional': False} opts one compile out", "min": 0})
    auto_cudagraphs: bool = field(default=True, metadata={"doc": "default mode: an inference graph whose kernels take less device time than launching them takes host time (a small model; estimated at compile time, or measured on its first calls where the estimate says device-bound: BERT-base inference on the H100), or a training graph whose host time is near its device time (a ResNet-50 or 1B Llama step, not in distributed training), replays as one CUDA graph, when it can be captured (ember/cudagraphs/auto.py has the rules); False: never in default mode (mode='reduce-overhead' replays every graph)"})
    aot_joint_analyzed: bool = field(default=True, metadata={"doc": "a training graph whose outputs the frontend saw as fresh tensors is analyzed inside its joint forward+backward trace (ember/aot/trace.py trace_joint_analyzed) instead of by a functionalized run of its own first; where the analysis finds a mutated input or an aliased output, the trace stops and the analysis-first path runs. Off: always analysis first (for comparisons)"})
    aot_block_reuse: bool = field(default=True, metadata={"doc": "each distinct repeated block of a graph (the layers of a ModuleList, found as regional compilation finds them) is traced to ATen once, alone, and its forward (and backward) nodes are copied into the whole graph for every call (ember/aot/blocks.py): the graph is the one tracing every layer gives, and a 24-layer model's trace costs about one layer's plus the glue. Off: every layer traced (for comparisons)"})
    aot_joint_unfunctionalized: bool = field(default=True, metadata={"doc": "a training graph analyzed inside its joint trace (aot_joint_analyzed) whose captured graph shows no mutation is traced without the functionalization layer (ember/aot/trace.py), ~27% of a 24-layer Llama's joint trace; the graph is kept only where every recorded op mutates nothing (then it is the functionalized trace's graph), else the functionalized trace runs. Off: always functionalized"})
    aot_cache: bool = field(default=True, metadata={"doc": "keep traced forward/backward graphs on disk (under cache_dir), so a later process skips analysis and tracing"})
    triton_key_process: bool = field(default=True, metadata={"doc": "read at import: on a machine with an NVIDIA device and Triton, import ember starts a child process computing Triton's cache key (a hash of libtriton, 0.4 GB), which every first kernel build waits for; it runs on another core while the program builds its model, instead of in a thread beside the first trace (ember/triton_key.py). Off: the key is hashed in this process when the first frame is traced"})
    frontend_fake_memo: bool = field(default=True, metadata={"doc": "the frontend replays the fake-tensor result of a graph call it already propagated with arguments of the same metadata (a model's repeated layers) instead of running the op on fake tensors again, where the replay provably gives the same tensors (ember/frontend/fake_memo.py); the graph and guards are the same. Off: every call propagates (for comparisons)"})
    frontend_cache: bool = field(default=True, metadata={"doc": "keep compiled cache entries (guards, generated entry function, captured graph) on disk (under cache_dir), so a later process running the same code in the same environment installs them instead of tracing; every guard is still checked on the live arguments (ember/frontend/persist.py)"})
    run_stats: str = field(default="", metadata={"doc": "ember run: write the compile counters (graphs compiled, recompiles, eager fallbacks) as JSON to this path when the script ends (empty: do not)"})
    cache_dir: str = field(default=os.path.join(os.path.expanduser("~"), ".cache", "ember"), metadata={"doc": "on-disk cache for compiled artifacts", "check": _check_nonempty})

    # the one place values are checked: the generated __init__ assigns each field through here too,
    # so Config(...) and from_env need no __post_init__ of their own
    def __setattr__(self, name: str, value) -> None:
        f = _FIELDS.get(name)
        if f is None:
            raise _no_such_setting(name)
        problem = _problem(f, value)
        if problem is not None:
            error, text, doc = problem
            raise error(f"ember.config.{name} {text}, got {type(value).__name__} {value!r}{doc}")
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str):  # only called for a name that is not a field
        raise _no_such_setting(name)

    @classmethod
    def from_env(cls, environ=None) -> "Config":
        """The defaults, overridden by the ``EMBER_*`` variables of ``environ`` (default ``os.environ``)."""
        environ = os.environ if environ is None else environ
        kwargs = {}
        for f in dataclasses.fields(cls):
            var = _env_name(f.name)
            raw = environ.get(var)
            if raw is None:
                continue
            value = _parse_env(f, var, raw)
            problem = _problem(f, value)
            if problem is not None:
                raise ValueError(f"{var}={raw!r}: {f.name} {problem[1]}{problem[2]}. Fix or unset {var}.")
            kwargs[f.name] = value
        return cls(**kwargs)


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _no_such_setting(name: str) -> AttributeError:
    close = difflib.get_close_matches(name, _FIELDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    return AttributeError(f"ember.config has no setting {name!r}{hint} Settings: {', '.join(_FIELDS)} "
                          "(docs/config.md)")


_TYPE_WORDS = {bool: "True or False", int: "an int", str: "a str"}
for _f in _FIELDS.values():  # the checks and the environment parser know these kinds only
    if type(_f.default) not in _TYPE_WORDS:
        raise TypeError(f"Config.{_f.name}: a setting's default must be a bool, int or str (its type is "
                        f"the setting's type), got {type(_f.default).__name__}; add the kind to _TYPE_WORDS "
                        "and _parse_env to support it")


def _problem(f: dataclasses.Field, value) -> tuple[type, str, str] | None:
    """(exception type, what is wrong, what the setting means or "") for ``value`` in field ``f``, or
    None when it is valid."""
    doc = f" ({f.name}: {f.metadata['doc']})"
    kind = type(f.default)
    # exact types: True is an int to isinstance, 1 is not a bool
    ok = type(value) is bool if kind is bool else (isinstance(value, kind) and type(value) is not bool)
    if not ok:
        return TypeError, f"must be {_TYPE_WORDS[kind]}", doc
    lo = f.metadata.get("min")
    if lo is not None and value < lo:
        return ValueError, f"must be >= {lo}", doc
    check = f.metadata.get("check")
    text = check(value) if check is not None else None
    return (ValueError, text, "") if text else None


def _parse_env(f: dataclasses.Field, var: str, raw: str):
    kind = type(f.default)
    if kind is bool:
        value = BOOL_SPELLINGS.get(raw.strip().lower())
        if value is None:
            true = ", ".join(k for k, v in BOOL_SPELLINGS.items() if v)
            false = ", ".join(k for k, v in BOOL_SPELLINGS.items() if not v)
            raise ValueError(f"{var}={raw!r} is not a boolean; accepted (any case): {true} for True, "
                             f"{false} for False")
        return value
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{var}={raw!r} is not an integer ({f.metadata['doc']})") from None
    return raw


ENV_TABLE = [(_env_name(f.name), f.name, f.default, f.metadata.get("doc", "")) for f in dataclasses.fields(Config)]


def markdown_table() -> str:
    """The table docs/config.md shows (a test keeps the two identical)."""
    rows = ["| Variable | Field | Default | Meaning |", "|---|---|---|---|"]
    for env, name, default, doc in ENV_TABLE:
        shown = "~/.cache/ember" if name == "cache_dir" else repr(default)
        rows.append(f"| `{env}` | `{name}` | `{shown}` | {doc} |")
    return "\n".join(rows) + "\n"


# Triton's own spellings of true for a boolean variable (triton._C.libtriton.getenv_bool, any case): ember
# must call the interpreter on exactly when Triton does, or it emits GPU-only code the interpreter runs
TRITON_TRUE = ("1", "true", "yes", "on", "y")


class Environment:
    """The variables of other programs that ember must agree with. This and ``Config.from_env`` are
    the only reads of the environment in ember (tests/test_layering.py keeps it so).

    These are read at each use, not cached: Triton reads ``TRITON_INTERPRET`` through its knobs on
    every launch, and OpenVINO's torch.compile integration reads its variables at every compile; a copy
    taken at ``import ember`` would disagree with them once a test or a user changes the variable.
    Every use is at compile time (or at a module's import), never per call of a compiled function.
    """

    VARIABLES = {
        "TRITON_INTERPRET": "Triton runs kernels in its CPU interpreter (read by Triton itself; ember "
                            "follows it and sets it to 1 before importing Triton for forced CPU kernels)",
        "OPENVINO_TORCH_BACKEND_DEVICE": "openvino backend: default of the 'device' option",
        "OPENVINO_TORCH_MODEL_CACHING": "openvino backend: default of the 'model_caching' option",
        "OPENVINO_TORCH_CACHE_DIR": "openvino backend: default of the 'cache_dir' option",
        "TRITON_CACHE_DIR": "Triton's cache of kernels and launcher modules (ember points it elsewhere when the "
                            "directory is unsafe: ember/native/triton_cache.py)",
        "TRITON_DUMP_DIR": "Triton's IR dump directory (checked like TRITON_CACHE_DIR when dumps are on)",
        "TRITON_OVERRIDE_DIR": "Triton's kernel override directory (checked like TRITON_CACHE_DIR when overrides are on)",
        "CXX": "the C++ compiler that builds the native backend's CPU kernels (native_cpu='cpp', the default; "
               "unset: c++, then g++, on PATH)",
        # glibc malloc's own settings: set by the user, native_cpu_malloc leaves malloc alone (ember/native/cpu_heap.py)
        "MALLOC_TRIM_THRESHOLD_": "glibc malloc's trim threshold (set: native_cpu_malloc changes nothing)",
        "MALLOC_MMAP_THRESHOLD_": "glibc malloc's mmap threshold (set: native_cpu_malloc changes nothing)",
        "MALLOC_TOP_PAD_": "glibc malloc's top pad (set: native_cpu_malloc changes nothing)",
        "MALLOC_MMAP_MAX_": "glibc malloc's mmap count limit (set: native_cpu_malloc changes nothing)",
        "GLIBC_TUNABLES": "glibc's tunables (with a glibc.malloc one: native_cpu_malloc changes nothing)",
        "DISABLE_ADDMM_CUDA_LT": "PyTorch's switch off of cuBLASLt for CUDA addmm (=1: the native backend keeps a "
                                 "tanh GELU in its Triton kernels, not the matmul's epilogue: ember/native/cuda_mm.py)",
    }

    def with_prefixes(self, prefixes: tuple) -> list:
        """Every set variable whose name starts with one of ``prefixes``, sorted (name, value) pairs:
        what the persisted frontend cache keys its entries on (ember/frontend/persist.py)."""
        return sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes))

    def get(self, name: str) -> str | None:
        """The raw value of one of ``VARIABLES`` (None: unset)."""
        if name not in self.VARIABLES:
            raise KeyError(f"{name!r} is not an environment variable ember reads; add it to "
                           f"ember.config.Environment.VARIABLES with its meaning (known: {', '.join(self.VARIABLES)})")
        return os.environ.get(name)

    @property
    def triton_interpret(self) -> bool:
        """Whether Triton runs kernels in its interpreter, as Triton itself decides it."""
        return (self.get("TRITON_INTERPRET") or "").strip().lower() in TRITON_TRUE

    def set(self, name: str, value: str) -> None:
        """Set one of ``VARIABLES`` for this process and the processes it starts (the library that
        reads it agrees with ember)."""
        self.get(name)  # (a known variable)
        os.environ[name] = value

    def for_child(self, **overrides: str) -> dict:
        """The environment a child process of ember's gets: this one's, with ``overrides`` (each one
        of ``VARIABLES``)."""
        for name in overrides:
            self.get(name)
        return {**os.environ, **overrides}

    def request_triton_interpreter(self) -> None:
        """Ask for the interpreter before Triton is imported (it picks its mode at import); a value the
        user set is left alone."""
        os.environ.setdefault("TRITON_INTERPRET", "1")


config = Config.from_env()
environment = Environment()
