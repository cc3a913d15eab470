"""Load and run an ember AOT package (``ember.export.aot_compile``): the whole runtime.

This module imports torch and the standard library only (never ember's frontend, FX or compilers),
so a server that calls ``aot_load`` starts in ``import torch`` plus reading one file. At load it:

1. reads ``manifest.json`` from the package (a zip) and refuses a package built for another torch,
   Triton, device kind or CPU (feature flags the package's C++ code may use), saying which and how
   to fix it;
2. maps the weights (``weights.bin``, ``weights.py``): no copy on the CPU, one copy to the GPU;
3. ``exec``s the generated wrapper (``wrapper.py``: plain Python calling ATen ops) into a fresh
   namespace; a package's ``native/`` entries (ember's native wrapper and its kernels: C++ units
   with their ``.so`` files, or Triton kernels with their compiled binaries) replace it with the
   native wrapper: the ``.so`` files are loaded as they are, Triton finds its binaries in the
   package's cache, so nothing is compiled. The native wrapper imports its small runtime modules
   (``ember.native.runtime``, ``ember.native.cpp_build`` or Triton), never ember's frontend or the
   code generator.

The returned ``AOTModule`` flattens the call's (args, kwargs) like the exported program, checks the
dynamic dims' ranges and static sizes, runs the wrapper and rebuilds the output structure.
"""
from __future__ import annotations

import importlib
import json
import platform
import zipfile

import torch
import torch.utils._pytree as pytree

from ember.export import weights as weights_blob

FORMAT = "ember-aot/2"  # /2: weights.bin (mapped), C++ kernels


class PackageMismatch(RuntimeError):
    """The package was built for another torch/Triton/device/CPU than this process has."""


def cpu_features() -> str:
    """The CPU capability torch dispatches to (e.g. 'AVX512', 'AVX2', 'DEFAULT')."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - very old torch: unknown
        return "unknown"


def cpu_flags() -> list:
    """This CPU's feature flags (``/proc/cpuinfo``; empty where unknown): what code built with
    ``-march=native`` may use."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return sorted(set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def triton_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:  # noqa: BLE001 - not installed
        return None


def environment(device: str) -> dict:
    """What a package records about the machine it was built for, and is checked against at load."""
    env = {"torch": torch.__version__, "device": device, "machine": platform.machine(),
           "cpu_features": cpu_features(), "cpu_flags": cpu_flags()}
    if device == "cuda":
        env["triton"] = triton_version()
        env["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            env["gpu_capability"] = f"sm_{major}{minor}"
    return env


def check_environment(recorded: dict, path: str) -> None:
    device = recorded.get("device", "cpu")
    here = environment(device)
    if device == "cuda" and not torch.cuda.is_available():
        raise PackageMismatch(f"{path} was compiled for CUDA, but this process sees no CUDA device; load it on "
                              "a GPU machine or rebuild it with aot_compile(ep, path, device='cpu')")
    # the CPU's features matter only where compiled CPU code is in the package
    keys = ["torch", "machine"] + (["triton", "cuda", "gpu_capability"] if device == "cuda" else [])
    keys += ["cpu_features"] if recorded.get("native_cpu_code") else []
    for key in keys:
        if recorded.get(key) != here.get(key):
            raise PackageMismatch(f"{path} was built for {key}={recorded.get(key)!r} but this process has "
                                  f"{key}={here.get(key)!r}; rebuild the package here with "
                                  "ember.export.aot_compile (or load it where it was built)")
    if recorded.get("native_cpu_code"):  # its .so files may use any feature of the CPU they were built on
        missing = sorted(set(recorded.get("cpu_flags") or ()) - set(here["cpu_flags"]))
        if missing and here["cpu_flags"]:
            raise PackageMismatch(f"{path} holds C++ kernels built for a CPU with features this CPU lacks "
                                  f"({', '.join(missing[:12])}{'...' if len(missing) > 12 else ''}); rebuild the "
                                  "package on this machine with ember.export.aot_compile, or build it with "
                                  "kernels='aten'")


class AOTModule:
    """A loaded package: call it like the exported module."""

    def __init__(self, path: str, manifest: dict, namespace: dict, weights: list, device: torch.device):
        self.path, self.manifest, self.device = path, manifest, device
        self._run = namespace["forward"]
        self._weights = weights
        for name in manifest.get("spec_modules", ()):  # e.g. transformers.modeling_outputs: registers its
            importlib.import_module(name)               # output classes with pytree (the specs name them)
        self._in_spec = pytree.treespec_loads(manifest["in_spec"])
        self._out_spec = pytree.treespec_loads(manifest["out_spec"])
        self._inputs = manifest["user_inputs"]  # per flat input: {"name", "shape": [int | symbol name]}
        self._ranges = {k: tuple(v) for k, v in manifest["ranges"].items()}
        self._mutated = manifest["mutated_user_inputs"]  # [(output position, flat input position)]

    def _check(self, flat: list) -> None:
        bound: dict = {}
        for value, spec in zip(flat, self._inputs):
            if spec["shape"] is None:
                continue
            if not isinstance(value, torch.Tensor) or value.dim() != len(spec["shape"]):
                raise ValueError(f"{self.path}: input {spec['name']} must be a {len(spec['shape'])}-d tensor")
            if value.device.type != self.device.type:  # (kernels take raw addresses: no check of their own)
                raise ValueError(f"{self.path}: input {spec['name']} is on {value.device}, but the package runs "
                                 f"on {self.device}: move it there first (.to({str(self.device)!r}))")
            for d, (size, want) in enumerate(zip(value.shape, spec["shape"])):
                if isinstance(want, int):
                    if size != want:
                        raise ValueError(f"{self.path}: input {spec['name']}.size({d}) is {size}, but the package "
                                         f"was exported for {want} (export with a Dim to make it dynamic)")
                    continue
                lo, hi = self._ranges.get(want, (None, None))
                if (lo is not None and size < lo) or (hi is not None and size > hi):
                    raise ValueError(f"{self.path}: input {spec['name']}.size({d}) = {size} is outside the range "
                                     f"of {want} [{lo}, {hi}]")
                if bound.setdefault(want, size) != size:
                    raise ValueError(f"{self.path}: input {spec['name']}.size({d}) = {size} must equal the other "
                                     f"dimensions of symbol {want} ({bound[want]})")

    def __call__(self, *args, **kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise ValueError(f"{self.path}: the call's arguments are structured as {spec}, but the package "
                             f"expects {self._in_spec}")
        self._check(flat)
        outs = self._run(*self._weights, *flat)
        # outputs: new values of mutated buffers and inputs (copied back, as ep.module() does), then
        # the flattened user outputs
        for pos, k in self.manifest["buffer_mutations"]:
            self._weights[k].copy_(outs[pos])
        for pos, k in self._mutated:
            flat[k].copy_(outs[pos])
        first = len(self.manifest["buffer_mutations"]) + len(self._mutated)
        return pytree.tree_unflatten(list(outs[first:]), self._out_spec)


def aot_load(path: str, device: str | None = None) -> AOTModule:
    """Load a package written by ``ember.export.aot_compile``; returns a callable.

    ``device`` overrides where the weights go (default: the device the package was built for)."""
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        if manifest.get("format") != FORMAT:
            raise PackageMismatch(f"{path} is not an ember AOT package of format {FORMAT} "
                                  f"(found {manifest.get('format')!r}); rebuild it with ember.export.aot_compile")
        check_environment(manifest["environment"], path)
        wrapper = zf.read("wrapper.py").decode()
        native = {n[len("native/"):]: zf.read(n) for n in zf.namelist() if n.startswith("native/")}
    dev = torch.device(device or manifest["environment"]["device"])
    weights = weights_blob.read(path, manifest["weights"], dev)
    namespace: dict = {"__name__": f"ember_aot_{manifest['name']}", "torch": torch}
    exec(compile(wrapper, f"<ember aot package {path}: wrapper.py>", "exec"), namespace)
    if native:
        namespace["forward"] = _load_native(native, manifest["native"], dev, namespace["forward"], path)
    return AOTModule(path, manifest, namespace, weights, dev)


def _load_native(files: dict, record: dict, dev, fallback, path: str):
    """ember's native wrapper with its kernels: the files go to a private folder (removed at exit);
    C++ units get their packaged ``.so`` registered as their build (``cpp_build.register_prebuilt``),
    Triton's cache is pointed at the binaries the package came with; so nothing is compiled. The
    wrapper's ``make_call`` gives the function to run. Imports ``ember.native.runtime`` (the
    wrapper's own small runtime), ``ember.native.cpp_build`` or Triton; not the frontend or the code
    generator."""
    import atexit
    import os
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="ember_aot_")  # mode 0700: the loader trusts only its own files
    atexit.register(shutil.rmtree, folder, True)
    for rel, data in files.items():
        if rel == "graph.py" or rel == "constants.bin":
            continue
        dest = os.path.join(folder, rel)
        if not os.path.abspath(dest).startswith(folder + os.sep):
            raise PackageMismatch(f"{path}: refusing the entry native/{rel} (outside the package folder)")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(data)
    renderer = record.get("renderer", "triton")
    if renderer == "cpp":
        from ember.native import cpp_build
        for unit, so in record["binaries"].items():
            cpp_build.register_prebuilt(os.path.join(folder, "kernels", unit), os.path.join(folder, "kernels", so))
    else:
        from ember.config import environment
        environment.set("TRITON_CACHE_DIR", os.path.join(folder, "triton_cache"))  # read by Triton at each lookup
    src = files["graph.py"].decode()
    for original, base in record["kernel_paths"].items():
        src = src.replace(repr(original), repr(os.path.join(folder, "kernels", base)))
    graph_path = os.path.join(folder, "graph.py")
    with open(graph_path, "w") as f:
        f.write(src)
    # imported as a file of this private folder (not through ember.native.cache, whose loader also
    # readies Triton's helpers: a C++ package's process never imports Triton)
    import hashlib
    import importlib.util
    import sys
    name = "ember_aot_graph_" + hashlib.sha256(src.encode()).hexdigest()[:32]
    spec = importlib.util.spec_from_file_location(name, graph_path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    consts = weights_blob.read(path, record["constant_records"], dev, "native/constants.bin")
    call = mod.make_call(consts, fallback)
    call_info = {"renderer": renderer, "kernels_loaded": 0, "kernels_jit": 0, "reason": None}
    if record.get("launches"):
        from ember.native.warm_launch import adopt
        adopt(mod, record["launches"], os.path.join(folder, "triton_cache"), call_info)
    try:
        call.ember_aot = call_info
    except AttributeError:
        pass
    return call
