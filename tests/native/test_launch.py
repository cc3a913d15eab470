"""The wrapper's launch path: after the first call a launch site calls Triton's compiled launcher
directly (no argument binding, no cache lookup) and checks alignment only of pointers that may
move. CPU tests drive ``Launch`` with a stand-in driver and compiled kernel; GPU tests run the real
thing. What the wrapper costs per call is measured by benchmarks/probes/wrapper_cost.py."""
import re
import time

import pytest
import torch

pytest.importorskip("triton")

from ember.native import compile_aten_graph  # noqa: E402
from ember.native.cache import load_module  # noqa: E402
from ember.native.runtime import Launch  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402


class _Compiled:
    """What ``JITFunction[grid](...)`` returns on a GPU: a kernel with a raw launcher."""

    def __init__(self):
        self.calls = []
        self.function, self.packed_metadata = "fn-handle", "packed"
        self.run = lambda *a: self.calls.append(a)


class _Jit:
    arg_names = ["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"]

    def __init__(self):
        self.kernel, self.slow = _Compiled(), 0

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.slow += 1
            return self.kernel
        return launch


class _Driver:
    def get_current_device(self):
        return 3

    def get_current_stream(self, device):
        return 1000 + device


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


def test_fast_path_after_the_first_call(fake_driver):
    jit = _Jit()
    launch = Launch(jit, (4,), {"XBLOCK": 256, "num_warps": 4}, fresh=(1,))
    x, out = _Ptr(4096), _Ptr(8192)
    launch(x, out, 1000)
    assert jit.slow == 1 and jit.kernel.calls == []
    launch(x, out, 1000)
    launch(_Ptr(4096 + 32), _Ptr(7), 1000)  # moved but still aligned input; output never checked
    assert jit.slow == 1
    first = jit.kernel.calls[0]
    assert first[:8] == (4, 1, 1, 1003, "fn-handle", "packed", None, None)
    # hooks, args (tensors as their addresses: runtime.RAW_POINTERS), then the constexprs
    assert first[8:] == (None, x.addr, out.addr, 1000, 256)
    launch(_Ptr(4096 + 4), out, 1000)  # an input that lost 16-byte alignment: the normal path
    assert jit.slow == 2 and len(jit.kernel.calls) == 2


class _CudaLauncher:
    """Triton 3.x's launcher object: a Python ``__call__`` around the compiled C ``launch``."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, scratch=0):
        self.global_scratch_size = scratch
        self.direct, self.wrapped = [], []

    def launch(self, *args):
        if len(args) < 14:  # what the C launcher's argument parsing would reject
            raise TypeError("function takes at least 14 arguments")
        self.direct.append(args)

    def __call__(self, *args):
        self.wrapped.append(args)


@pytest.mark.parametrize("scratch", [0, 64])
def test_fast_path_calls_the_c_launcher_directly(fake_driver, scratch):
    jit = _Jit()
    jit.kernel.run = run = _CudaLauncher(scratch)
    launch = Launch(jit, (4,), {"XBLOCK": 256, "num_warps": 4}, fresh=(1,))
    x, out = _Ptr(4096), _Ptr(8192)
    launch(x, out, 1000)
    launch(x, out, 1000)
    if scratch:  # scratch memory is allocated by the Python launcher: keep it
        assert run.direct == [] and run.wrapped[0][5:9] == ("packed", None, None, None)
        return
    assert run.wrapped == [] and len(run.direct) == 1
    assert run.direct[0] == (4, 1, 1, 1003, "fn-handle", False, True, None, None, "packed", None, None, None,
                             x.addr, out.addr, 1000, 256)


def test_direct_launch_type_error_falls_back(fake_driver):
    jit = _Jit()
    jit.kernel.run = run = _CudaLauncher()
    run.launch = lambda *a: (_ for _ in ()).throw(TypeError("bad arguments"))  # another C signature
    launch = Launch(jit, (1,), {"XBLOCK": 16, "num_warps": 1})
    launch(_Ptr(0), _Ptr(0), 16)                    # Triton's normal path; keeps the kernel
    launch(_Ptr(0), _Ptr(0), 16)                    # direct call rejected: the normal path runs it
    launch(_Ptr(0), _Ptr(0), 16)                    # normal path again, which keeps the kernel
    launch(_Ptr(0), _Ptr(0), 16)                    # then Triton's Python launcher, without binding
    assert jit.slow == 3 and len(run.wrapped) == 1 and launch.direct is False


def test_interpreter_or_hooks_keep_the_normal_path(fake_driver, monkeypatch):
    from triton import knobs
    jit = _Jit()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    launch = Launch(jit, (1,), {"XBLOCK": 16, "num_warps": 1})
    for _ in range(3):
        launch(_Ptr(0), _Ptr(0), 16)
    assert jit.slow == 3 and launch.fast is None


def _compiled_tiny(native_cache):
    x = torch.randn(16, device=DEVICE)
    gm = trace(lambda x: x * 2 + 1, [x])
    fn = compile_aten_graph(gm, [x], force_triton=True, options={"cache_dir": native_cache})
    return fn, x


def test_wrapper_marks_its_own_buffers_fresh(native_cache):
    fn, x = _compiled_tiny(native_cache)
    src = open(fn.ember_native["wrapper"]).read()
    assert re.search(r"launch0 = Launch\(\w+, \(1,\), \{.*\}, fresh=\(1,\), spec=\(torch.float32, torch.float32, 16\)\)",
                     src), src
    assert "LAUNCHES = [launch0]" in src


class _Warm:
    """A kernel whose ``warmup`` records what it was asked to build."""

    def __init__(self):
        self.built = []

    def warmup(self, *args, grid, **meta):
        self.built.append((args, grid, meta))


def test_precompile_builds_each_static_site_once_ahead_of_its_call():
    pytest.importorskip("triton", minversion="3.5")  # AsyncCompileMode
    from ember.native.runtime import precompile
    k = _Warm()
    sites = [Launch(k, (4,), {"XBLOCK": 8, "num_warps": 1}, spec=(torch.float32, 32)),
             Launch(k, (2,), {"XBLOCK": 16, "num_warps": 2}, spec=(torch.bfloat16, 32)),
             Launch(k, (1,), {"XBLOCK": 8}),               # no spec: built at its first call
             Launch(k, (1,), {"XBLOCK": 8}, spec=(torch.float32, 8))]
    sites[3].fast = ()  # already called once: nothing to build
    assert precompile(sites, threads=4) == 2
    assert sorted(k.built, key=lambda b: b[1]) == [((torch.bfloat16, 32), (2, 1, 1), {"XBLOCK": 16, "num_warps": 2}),
                                                    ((torch.float32, 32), (4, 1, 1), {"XBLOCK": 8, "num_warps": 1})]
    assert precompile(sites, threads=1) == 0 and len(k.built) == 2  # one thread: each builds at its first call


def test_wrapper_with_a_stubbed_launch_does_only_its_own_work(native_cache):
    """The generated wrapper with launches stubbed out: each call goes through the fast path of its
    one launch site exactly once and hands back the output buffer it allocated. (What that Python
    costs per call is measured by benchmarks/probes/wrapper_cost.py, not asserted here: a timed
    assertion flips with the host's load.)"""
    fn, x = _compiled_tiny(native_cache)
    mod = load_module(fn.ember_native["wrapper"])
    # the module is shared through the cache with later tests of the same graph: restore its launches
    launches = [v for v in vars(mod).values() if isinstance(v, Launch)]
    saved = [v.fast for v in launches]
    assert len(launches) == 1
    seen = []
    try:
        for v in launches:
            v.fast = (lambda *a: seen.append(a), 1, 1, 1, lambda d: 0, 0, None, (), ((0, True),), (16,))
        outs = [fn(x) for _ in range(50)]
    finally:
        for v, fast in zip(launches, saved):
            v.fast = fast
    assert len(seen) == 50
    for out, args in zip(outs, seen):
        out = out[0] if isinstance(out, (list, tuple)) else out
        assert out.shape == x.shape and out.dtype == x.dtype
        assert any(a is x for a in args) and any(a is out for a in args)  # reads x, writes the output


def _per_call_us(fn, x, n=3000):
    for _ in range(100):
        fn(x)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn(x)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


@pytest.mark.gpu
def test_gpu_launches_take_the_fast_path(native_cache):
    fn, x = _compiled_tiny(native_cache)
    for _ in range(3):
        torch.testing.assert_close(fn(x), x * 2 + 1)
    launches = [v for v in vars(load_module(fn.ember_native["wrapper"])).values() if isinstance(v, Launch)]
    assert launches and all(v.fast is not None for v in launches)
    base = torch.randn(17, device="cuda")
    odd = base[1:]  # 4 bytes past an aligned address: the kernel specialized on alignment must not run
    torch.testing.assert_close(fn(odd), odd * 2 + 1)
    torch.testing.assert_close(fn(x), x * 2 + 1)


@pytest.mark.gpu
def test_gpu_kernels_are_built_before_the_first_call(native_cache, monkeypatch):
    # (in this process: with the build workers up, kernels build there and the first call loads them
    # from the disk cache; test_build_pool.py checks that path)
    from ember.native import build_pool
    monkeypatch.setattr(build_pool, "_POOL", None)

    def f(x, w):
        a = torch.softmax(x, -1)
        b = torch.nn.functional.layer_norm(x, (x.shape[-1],), w)
        return a.sum(0) + b.amax(0), (a * b).cos()
    x, w = torch.randn(64, 96, device="cuda"), torch.randn(96, device="cuda")
    fn = compile_aten_graph(trace(f, [x, w]), [x, w], options={"cache_dir": native_cache})
    sites = load_module(fn.ember_native["wrapper"]).LAUNCHES
    assert len({id(s.fn) for s in sites}) >= 2

    def built():
        return sum(len(c[0]) for s in {id(s.fn): s for s in sites}.values() for c in s.fn.device_caches.values())
    before = built()
    assert before >= len({id(s.fn) for s in sites})
    for got, want in zip(fn(x, w), f(x, w)):
        torch.testing.assert_close(got, want)
    assert built() == before  # the first call found every binary built


@pytest.mark.gpu
def test_gpu_tiny_call_per_call_time(capsys):
    import types

    import ember

    def f(x):
        return x * 2 + 1
    compiled = ember.compile(types.FunctionType(f.__code__.replace(), f.__globals__, "f_compiled"))
    x = torch.randn(16, device="cuda")
    torch.testing.assert_close(compiled(x), f(x))
    eager_us, ember_us = _per_call_us(f, x), _per_call_us(compiled, x)
    with capsys.disabled():  # the acceptance figure is gpu_suite.py's overhead row, not a timed assertion
        print(f"\n[ember] x*2+1 on 16 floats: eager {eager_us:.1f} us, ember {ember_us:.1f} us per call")
    torch.testing.assert_close(compiled(x), f(x))


def test_precompile_with_a_build_pool_builds_stand_ins_once(monkeypatch):
    """With worker processes up (as on a GPU machine), sites whose kernel is not a Triton function
    still build once each, in this process."""
    pytest.importorskip("triton", minversion="3.5")
    from ember.native import build_pool
    from ember.native.runtime import precompile

    class Pool:
        def alive(self):
            return [object()]

        def n_ready(self):
            return 1
    monkeypatch.setattr(build_pool, "_POOL", Pool())
    k = _Warm()
    sites = [Launch(k, (4,), {"XBLOCK": 8}, spec=(torch.float32, 32)),
             Launch(k, (2,), {"XBLOCK": 16}, spec=(torch.bfloat16, 32))]
    assert precompile(sites, threads=4) == 2 and len(k.built) == 2
