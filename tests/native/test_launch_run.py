"""``Launch.run``: the per-site function generated when a launch site takes its fast path (alignment
checks unrolled, Triton's C launcher called with its fixed arguments bound), and the wrapper calling
it directly. CPU tests drive it with a stand-in driver and compiled kernel (as test_launch.py);
the GPU test runs the real launcher."""
import re

import pytest
import torch

pytest.importorskip("triton")

from ember.native import compile_aten_graph  # noqa: E402
from ember.native.cache import load_module  # noqa: E402
from ember.native.runtime import Launch  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402


class _CLauncher:
    """Triton 3.x's launcher object; ``launch`` stands for its compiled C function."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self):
        self.direct = []

    def launch(self, *args):
        if len(args) < 14:  # what the C launcher's argument parsing would reject
            raise TypeError("function takes at least 14 arguments")
        self.direct.append(args)


class _Compiled:
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self):
        self.run = _CLauncher()


class _Jit:
    arg_names = ["in_ptr0", "in_ptr1", "out_ptr0", "xnumel", "XBLOCK"]

    def __init__(self):
        self.kernel, self.slow = _Compiled(), []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.slow.append(args)
            return self.kernel
        return launch


class _Driver:
    def get_current_device(self):
        return 2

    def get_current_stream(self, device):
        return 500 + device


@pytest.fixture
def fake_driver():
    from triton.runtime import driver
    old = driver._active
    driver.set_active(_Driver())
    yield
    driver._active = old


class _Ptr:
    def __init__(self, addr):
        self.addr = addr

    def data_ptr(self):
        return self.addr


def test_run_is_generated_for_the_site_after_its_first_call(fake_driver):
    jit = _Jit()
    site = Launch(jit, (8,), {"XBLOCK": 128, "num_warps": 4}, fresh=(2,))
    a, b_odd, out = _Ptr(4096), _Ptr(4100), _Ptr(8192)  # b: not 16-byte aligned at the first call
    first = site.run
    site.run(a, b_odd, out, 1000)
    assert len(jit.slow) == 1 and site.run is not first and site.nargs == 4
    src = site.fast_source
    # one check per pointer that may move (the output is the wrapper's own buffer: never checked),
    # the launcher's arguments spelled out, no *args
    assert "def run(a0, a1, a2, a3):" in src and "*args" not in src
    assert re.search(r"p0 = a0\.data_ptr\(\)\n\s+if p0 & 15:", src)
    assert re.search(r"p1 = a1\.data_ptr\(\)\n\s+if not \(p1 & 15\):", src)
    assert "p2 =" not in src  # (passed as its address, never checked)
    a2, b2, out2 = _Ptr(4096 + 64), _Ptr(4100 + 32), _Ptr(7)  # moved, alignment kept; the output unchecked
    site.run(a2, b2, out2, 1000)
    assert len(jit.slow) == 1
    # tensors go to the C launcher as their addresses (runtime.RAW_POINTERS: no driver check per pointer)
    assert jit.kernel.run.direct == [(8, 1, 1, 502, "fn-handle", False, True, None, None, "packed", None, None, None,
                                      a2.addr, b2.addr, out2.addr, 1000, 128)]
    site(a, b_odd, out, 1000)  # calling the site itself takes the same path
    assert len(jit.slow) == 1 and len(jit.kernel.run.direct) == 2


def test_raw_pointers_off_passes_the_tensors(fake_driver, monkeypatch):
    from ember.native import runtime
    monkeypatch.setattr(runtime, "RAW_POINTERS", False)
    jit = _Jit()
    site = Launch(jit, (1,), {"XBLOCK": 16, "num_warps": 1}, fresh=(2,))
    a, b, out = _Ptr(0), _Ptr(16), _Ptr(32)
    site.run(a, b, out, 16)
    site.run(a, b, out, 16)
    assert jit.kernel.run.direct[0][13:] == (a, b, out, 16, 16)


def test_a_missing_tensor_takes_the_normal_path(fake_driver):
    jit = _Jit()
    site = Launch(jit, (1,), {"XBLOCK": 16, "num_warps": 1}, fresh=(2,))
    site.run(_Ptr(0), _Ptr(16), _Ptr(32), 16)
    site.run(_Ptr(0), _Ptr(16), None, 16)  # (None where a buffer was: Triton's own path decides)
    assert len(jit.slow) == 2 and site.fast is None


@pytest.mark.parametrize("a, b", [(4096 + 4, 4100), (4096, 4096)])
def test_run_takes_the_normal_path_when_alignment_changes(fake_driver, a, b):
    jit = _Jit()
    site = Launch(jit, (1,), {"XBLOCK": 16, "num_warps": 1}, fresh=(2,))
    site.run(_Ptr(4096), _Ptr(4100), _Ptr(0), 16)
    site.run(_Ptr(a), _Ptr(b), _Ptr(0), 16)  # a lost its alignment, or b gained it: not the kernel built
    assert len(jit.slow) == 2 and jit.kernel.run.direct == []


def test_run_falls_back_for_good_when_the_launcher_rejects_the_arguments(fake_driver):
    jit = _Jit()
    jit.kernel.run.launch = lambda *a: (_ for _ in ()).throw(TypeError("another C signature"))
    site = Launch(jit, (1,), {"XBLOCK": 16, "num_warps": 1})
    site.run(_Ptr(0), _Ptr(0), _Ptr(0), 16)
    site.run(_Ptr(0), _Ptr(0), _Ptr(0), 16)  # rejected: Triton's normal path runs it, then never direct
    assert len(jit.slow) == 2 and site.direct is False and site.fast is None


def test_a_fast_path_set_by_hand_takes_any_number_of_arguments():
    seen = []
    site = Launch(_Jit(), (1,), {"XBLOCK": 16})
    site.fast = (lambda *a: seen.append(a), 4, 1, 1, lambda d: d + 1, 6, "f", ("x",), ((0, True),), (16,))
    site.run(_Ptr(32), _Ptr(1), 7)
    site(_Ptr(48), 7)
    assert seen == [(4, 1, 1, 7, "f", "x", seen[0][6], seen[0][7], 7, 16), (4, 1, 1, 7, "f", "x", seen[1][6], 7, 16)]
    site.fast = None
    assert site.run == site._first_run


def test_the_wrapper_calls_run_of_its_static_sites(native_cache):
    x = torch.randn(16, device=DEVICE)
    fn = compile_aten_graph(trace(lambda x: x * 2 + 1, [x]), [x], force_triton=True,
                            options={"cache_dir": native_cache})
    src = open(fn.ember_native["wrapper"]).read()
    assert re.search(r"\n        launch0\.run\(arg0, buf0, 16\)\n", src), src
    out = fn(x)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, x * 2 + 1)


@pytest.mark.gpu
def test_gpu_sites_run_their_generated_function(native_cache):
    x = torch.randn(16, device="cuda")
    fn = compile_aten_graph(trace(lambda x: x * 2 + 1, [x]), [x], options={"cache_dir": native_cache})
    def first(out):
        return out[0] if isinstance(out, (list, tuple)) else out
    for _ in range(3):
        out = fn(x)
    torch.testing.assert_close(first(out), x * 2 + 1)
    sites = [v for v in vars(load_module(fn.ember_native["wrapper"])).values() if isinstance(v, Launch)]
    assert sites and all(s.fast is not None and "def run(a0, a1, a2):" in s.fast_source for s in sites)
    odd = torch.randn(17, device="cuda")[1:]  # 4 bytes past an aligned address: the normal path
    torch.testing.assert_close(first(fn(odd)), odd * 2 + 1)
    with torch.cuda.stream(torch.cuda.Stream()):  # the current stream is read at each call
        y = first(fn(x))
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 2 + 1)


def test_fast_path_factories_come_from_the_graphs_stored_code(fake_driver, tmp_path, monkeypatch):
    """A warm start's sites take their factories' code objects from what the compiling process stored
    beside the graph's launch record (no compile() per shape of call); a site whose source is not
    among them still compiles its own, and a tampered store is ignored."""
    import builtins
    import types

    from ember.native import cache, runtime, warm_launch
    monkeypatch.setattr(runtime, "_FAST_FACTORIES", {})
    monkeypatch.setattr(runtime, "_FAST_BY_SHAPE", {})
    site = Launch(_Jit(), (8,), {"XBLOCK": 128, "num_warps": 4}, fresh=(2,))
    site.run(_Ptr(4096), _Ptr(4100), _Ptr(8192), 1000)
    key, base = "ef" * 32, str(tmp_path)
    warm_launch._store_factories(types.SimpleNamespace(launch0=site), key, base, cache.root(base))
    # a later process: nothing compiled yet
    monkeypatch.setattr(runtime, "_FAST_FACTORIES", {})
    monkeypatch.setattr(runtime, "_FAST_BY_SHAPE", {})
    compiled = []
    real_compile = builtins.compile
    monkeypatch.setattr(builtins, "compile", lambda *a, **k: compiled.append(a[1]) or real_compile(*a, **k))
    warm_launch._prime_factories(key, base)
    again = Launch(_Jit(), (8,), {"XBLOCK": 128, "num_warps": 4}, fresh=(2,))
    again.run(_Ptr(4096), _Ptr(4100), _Ptr(8192), 1000)
    assert again.fast_source == site.fast_source and runtime._FACTORY_FILE not in compiled
    a, b, out = _Ptr(4096 + 64), _Ptr(4100 + 32), _Ptr(7)
    again.run(a, b, out, 1000)  # (the stored factory runs the launch as a compiled one does)
    assert again.fn.kernel.run.direct[-1][-5:] == (a.addr, b.addr, out.addr, 1000, 128)
    other = Launch(_Jit(), (8,), {"XBLOCK": 128, "num_warps": 4})  # (another shape of call: no fresh buffer)
    other.run(_Ptr(4096), _Ptr(4100), _Ptr(8192), 1000)
    assert compiled.count(runtime._FACTORY_FILE) == 1
    path = warm_launch._code_path(key, base)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-1] + bytes([data[-1] ^ 1]))
    monkeypatch.setattr(runtime, "_FAST_FACTORIES", {})
    warm_launch._prime_factories(key, base)  # (checksum: not trusted, nothing taken)
    assert runtime._FAST_FACTORIES == {}
