"""Warm starts adopt the kernels the compiling process recorded (ember/native/warm_launch.py): no
Triton JIT at the first call of a process whose graphs come from the disk cache. The adoption itself
needs a GPU (the interpreter has no binaries); the record's trust rules are checked on CPU."""
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from ember.native import warm_launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Site:
    fast = None

    def __init__(self):
        self.adopted = []

    def adopt(self, kernel, checks, nargs):
        self.adopted.append((kernel, checks, nargs))
        return True


def _entry(files):
    return {"hash": "h", "files": files, "arg_names": ["x"], "signature": {"x": "*fp32"}, "constants": [],
            "checks": [[0, True]], "nargs": 1}


def test_a_record_pointing_outside_the_cache_or_at_missing_files_keeps_the_jit(tmp_path):
    pytest.importorskip("triton")
    cache = tmp_path / "triton"
    cache.mkdir()
    (tmp_path / "outside.cubin").write_bytes(b"x")
    mod = types.SimpleNamespace(launch0=_Site(), launch1=_Site())
    info = {}
    warm_launch.adopt(mod, {"launch0": _entry({"k.cubin": "../outside.cubin"}),
                            "launch1": _entry({"k.cubin": "ab/missing.cubin"})}, str(cache), info)
    assert info.get("kernels_loaded", 0) == 0 and info["kernels_jit"] == 2
    assert not mod.launch0.adopted and not mod.launch1.adopted


def test_describe_records_only_sites_with_kernels_inside_the_cache(tmp_path):
    from ember.native.runtime import Launch
    fn = types.SimpleNamespace(arg_names=["x", "BLOCK"])
    inside, outside = Launch(fn, (1,), {"BLOCK": 4}), Launch(fn, (1,), {"BLOCK": 4})
    src = types.SimpleNamespace(fn=fn, signature={"x": "*fp32"}, constants={(1,): 4})
    for site, path in ((inside, tmp_path / "c" / "ab" / "k.cubin"), (outside, tmp_path / "elsewhere.cubin")):
        site.kernel = types.SimpleNamespace(hash="h", src=src, metadata_group={"k.cubin": str(path)})
        site.checks = ((0, True),)
    bare = Launch(fn, (1,), {"BLOCK": 4})  # never ran: no kernel
    small = type("SmallMM", (), {})()  # (a small-matmul extern keeps its sites per TF32 setting)
    small.launches = {True: inside, False: bare}
    got = warm_launch.describe(types.SimpleNamespace(launch0=inside, launch1=outside, launch2=bare, mm0=small),
                               str(tmp_path / "c"))
    assert sorted(got) == ["launch0", "mm0[True]"] and got["mm0[True]"]["owner"] == ["mm0", True]
    site = _Site()  # (records what it adopts)
    owner = type("SmallMM", (), {})()
    owner.launches = {True: site}
    monkey_kernel = types.SimpleNamespace()
    import triton.compiler.compiler as tcc
    real = tcc.CompiledKernel
    tcc.CompiledKernel = lambda src, group, h: monkey_kernel
    try:
        (tmp_path / "c" / "ab").mkdir(parents=True)
        (tmp_path / "c" / "ab" / "k.cubin").write_bytes(b"x")
        info = {}
        warm_launch.adopt(types.SimpleNamespace(mm0=owner), {"mm0[True]": got["mm0[True]"]}, str(tmp_path / "c"), info)
    finally:
        tcc.CompiledKernel = real
    assert info == {"kernels_loaded": 1} and site.adopted == [(monkey_kernel, ((0, True),), 1)]
    assert got["launch0"]["files"] == {"k.cubin": os.path.join("ab", "k.cubin")} and got["launch0"]["nargs"] == 1
    json.dumps(got)


def test_records_are_cache_entries_a_tampered_one_is_ignored(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(warm_launch, "describe", lambda mod, root: {"launch0": _entry({"k.cubin": "ab/k.cubin"})})
    monkeypatch.setattr(warm_launch, "_triton_cache_dir", lambda: str(tmp_path / "triton"))
    adopted = []
    monkeypatch.setattr(warm_launch, "adopt", lambda mod, launches, root, info: adopted.append(launches))
    # (graphs compiled by earlier tests in this process wait in _PENDING for the exit's flush: on a GPU
    # host, after tests/native/test_gpu_models.py, flush() wrote theirs too and counted them)
    monkeypatch.setattr(warm_launch, "_PENDING", {})
    key = "ab" * 32
    warm_launch.remember(key, str(tmp_path), object())
    assert warm_launch.flush() == 1 and warm_launch.flush() == 0  # (written once)
    assert warm_launch.adopt_recorded(object(), key, str(tmp_path)) == {}
    assert adopted and list(adopted[0]) == ["launch0"]
    path = warm_launch._path(key, str(tmp_path))
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data.replace(b"launch0", b"launch9"))
    assert warm_launch.adopt_recorded(object(), key, str(tmp_path)) is None  # (checksum: not trusted)
    assert warm_launch.adopt_recorded(object(), "cd" * 32, str(tmp_path)) is None  # (no record)


_PROBE = r"""
import json, sys, torch, ember
from ember.native import runtime, warm_launch
def f(x, w, v):
    # a pointwise kernel, a reduction, a small matmul (SmallMM's own launch site) and a cuBLAS one
    return torch.relu(x @ w).sin() * 2 + x.sum(1, keepdim=True) + (v @ v).sum()
x, w, v = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda"), torch.randn(1024, 1024, device="cuda")
out = ember.compile(f)(x, w, v)
torch.testing.assert_close(out, f(x, w, v), atol=1e-1, rtol=1e-2)
print("STATS " + json.dumps(dict(warm_launch.STATS, first=runtime.STATS["first"])))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_warm_process_runs_no_triton_jit(tmp_path):
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path / "ember"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)

    def run():
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
        lines = [l for l in out.stdout.splitlines() if l.startswith("STATS ")]
        assert out.returncode == 0 and lines, out.stderr[-3000:]
        return json.loads(lines[-1][6:])
    cold, warm = run(), run()
    assert cold["first"] >= 1 and cold["adopted"] == 0  # the first process compiled through the JIT...
    assert warm["adopted"] >= 1 and warm["jit"] == 0 and warm["first"] == 0  # ...the second loaded its binaries


def test_cuda_prewarm_starts_only_where_the_caller_has_cuda(monkeypatch):
    """A prewarm thread of its own would make a CUDA context on device 0 (another rank's GPU under
    one-GPU-per-process training): without CUDA initialized in the caller, nothing starts."""
    from ember.native import runtime
    monkeypatch.setattr(runtime, "_CUDA_PREWARM", None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    runtime.prewarm_cuda()
    assert runtime._CUDA_PREWARM is None


def test_a_wrapper_imports_a_kernel_module_only_when_its_function_is_read(tmp_path, monkeypatch):
    """``runtime.load_kernel`` gives a ``KernelRef``: the kernel module is imported at the first read
    of the function (a JIT launch, an attribute), and adopting a recorded binary reads nothing of it
    (the record's argument names stand in), so a warm start imports no kernel module."""
    pytest.importorskip("triton")
    from ember.native import runtime
    imported = []

    class _Fn:
        arg_names = ["x", "BLOCK"]

        def __getitem__(self, grid):
            return lambda *args, **meta: ("ran", grid, args, meta)

    checked = []

    def load_module(path, source=None):
        assert source == b"checked bytes"  # (executed from the bytes checked with the wrapper)
        imported.append(path)
        return types.SimpleNamespace(k=_Fn())
    monkeypatch.setattr(runtime, "load_module", load_module)
    monkeypatch.setattr(runtime, "loaded_module", lambda path: None)
    monkeypatch.setattr(runtime, "verified_source", lambda path: checked.append(path) or b"checked bytes")
    ref = runtime.load_kernel(str(tmp_path / "k.py"), "k")
    site = runtime.Launch(ref, (2,), {"BLOCK": 4})
    assert imported == [] and checked == [str(tmp_path / "k.py")] and "k.py" in repr(ref)  # checked, not run
    import triton.compiler.compiler as tcc
    monkeypatch.setattr(tcc, "CompiledKernel", lambda src, group, h: types.SimpleNamespace(
        packed_metadata=(), run=lambda *a: None, function=0))  # (a binary: Launch.adopt reads these)
    (tmp_path / "c" / "ab").mkdir(parents=True)
    (tmp_path / "c" / "ab" / "k.cubin").write_bytes(b"x")
    entry = dict(_entry({"k.cubin": "ab/k.cubin"}), arg_names=["x", "BLOCK"])
    warm_launch.adopt(types.SimpleNamespace(launch0=site), {"launch0": entry}, str(tmp_path / "c"), {})
    assert imported == [] and ref.arg_names == ["x", "BLOCK"]  # (adopting read the record's names)
    assert ref[(2, 1, 1)](1, BLOCK=4) == ("ran", (2, 1, 1), (1,), {"BLOCK": 4})  # a JIT launch imports it
    assert imported == [str(tmp_path / "k.py")]
    ref.arg_names  # noqa: B018
    assert len(imported) == 1  # (once)


def test_a_packed_record_keeps_each_binary_once_and_adopts_as_the_entries_do(tmp_path, monkeypatch):
    """``pack``: sites sharing a binary (a layer's kernels, once per layer) share one kernel entry in
    the record; ``adopt`` of the packed record loads each binary once and gives every site what the
    unpacked entries give it; a site whose index is not in the record keeps the JIT."""
    pytest.importorskip("triton")
    import triton.compiler.compiler as tcc
    cache = tmp_path / "c"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "k.cubin").write_bytes(b"x")
    (cache / "ab" / "m.cubin").write_bytes(b"x")
    other = dict(_entry({"k.cubin": "ab/m.cubin"}), hash="h2")
    entries = {"launch0": _entry({"k.cubin": "ab/k.cubin"}), "launch1": _entry({"k.cubin": "ab/k.cubin"}),
               "launch2": other, "launch3": dict(_entry({"k.cubin": "ab/k.cubin"}), checks=[[0, False]], nargs=2)}
    kernels, sites = warm_launch.pack(entries)
    assert [k["hash"] for k in kernels] == ["h", "h2"] and [s["kernel"] for s in sites.values()] == [0, 0, 1, 0]
    assert sites["launch3"] == {"checks": [[0, False]], "nargs": 2, "kernel": 0}
    record = json.loads(json.dumps({"kernels": kernels, "launches": sites}))  # (as stored)
    made = []
    monkeypatch.setattr(tcc, "CompiledKernel", lambda src, group, h: made.append(h) or ("kernel", h))
    results = []
    for launches in (entries, warm_launch.Packed(record["launches"], record["kernels"])):
        mod = types.SimpleNamespace(**{n: _Site() for n in entries})
        info = {}
        made.clear()
        warm_launch.adopt(mod, launches, str(cache), info)
        assert info == {"kernels_loaded": 4} and sorted(made) == ["h", "h2"]
        results.append({n: getattr(mod, n).adopted for n in entries})
    assert results[0] == results[1]
    assert results[1]["launch3"] == [(("kernel", "h"), ((0, False),), 2)]
    bad = warm_launch.Packed(dict(record["launches"], launch1=dict(record["launches"]["launch1"], kernel=7)),
                             record["kernels"])
    mod, info = types.SimpleNamespace(**{n: _Site() for n in entries}), {}
    warm_launch.adopt(mod, bad, str(cache), info)
    assert info["kernels_loaded"] == 3 and info["kernels_jit"] == 1 and not mod.launch1.adopted
