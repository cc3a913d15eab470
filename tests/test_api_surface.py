"""The torch.compiler-shaped API: registry, interop, modes/options, stance, graph and guard control.

Every behaviour is checked against what the same call does in eager PyTorch (or torch.compiler's
documented behaviour), with CompileCounter / the cache to tell compiled from eager runs.
"""
import bisect
import operator
import textwrap
import zlib

import pytest
import torch

import ember
from ember.backends import registry
from ember.testing import CompileCounter, cache_of


@pytest.fixture(autouse=True)
def _default_stance():
    yield
    ember.set_stance("default")


# ---- registry -----------------------------------------------------------------------------------
def test_list_backends_hides_debug_and_experimental():
    assert "ember" in ember.list_backends() and "inductor" in ember.list_backends()
    assert "eager" not in ember.list_backends()  # tagged "debug", as in torch.compiler
    assert "eager" in ember.list_backends(exclude_tags=())


def test_register_backend_as_decorator_with_and_without_arguments():
    calls = []

    @ember.register_backend
    def my_plain_backend(gm, example_inputs):
        calls.append("plain")
        return gm.forward

    @ember.register_backend(name="my_tagged", tags=("experimental",))
    def whatever(gm, example_inputs):
        calls.append("tagged")
        return gm.forward

    assert "my_plain_backend" in ember.list_backends()
    assert "my_tagged" not in ember.list_backends() and "my_tagged" in ember.list_backends(exclude_tags=())
    x = torch.randn(3)
    for name in ("my_plain_backend", "my_tagged"):
        assert torch.equal(ember.compile(lambda t: t * 2, backend=name)(x), x * 2)
    assert calls == ["plain", "tagged"]
    # lookup by callable finds the registered spec
    assert registry.backend_spec(my_plain_backend).name == "my_plain_backend"


def test_unknown_backend_names_the_available_ones():
    with pytest.raises(ValueError, match=r"unknown ember backend 'tvm'; available: .*eager.*ember.*inductor"):
        ember.compile(lambda x: x, backend="tvm")


def test_inductor_is_an_alias_of_the_native_backend():
    assert registry.backend_spec("inductor") is registry.backend_spec("ember")
    x = torch.randn(4)
    assert torch.equal(ember.compile(torch.sin, backend="inductor")(x), torch.sin(x))


def _fake_distribution(tmp_path, group: str, name: str, module: str, body: str):
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
    dist = tmp_path / f"{module}_dist-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:backend\n")


@pytest.mark.parametrize("group", ["ember_backends", "torch_dynamo_backends"])
def test_backends_of_other_packages_are_discovered_by_entry_point(tmp_path, monkeypatch, group):
    module = f"plugin_{group}"
    _fake_distribution(tmp_path, group, f"from_{group}", module, """
        SEEN = []
        def backend(gm, example_inputs):
            SEEN.append(len(example_inputs))
            return gm.forward
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    assert f"from_{group}" in ember.list_backends()
    x = torch.randn(2)
    assert torch.equal(ember.compile(lambda t: t + 1, backend=f"from_{group}")(x), x + 1)
    import importlib

    assert importlib.import_module(module).SEEN == [1]


def test_torch_compile_finds_ember_through_its_entry_point():
    import importlib.metadata as md

    import torch._dynamo  # the peer, in a test only

    if not any(ep.name == "ember" for ep in md.entry_points(group="torch_dynamo_backends")):
        pytest.skip("ember is not pip-installed here (only on PYTHONPATH): no entry point to find")

    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    assert torch.allclose(torch.compile(m, backend="ember")(x), m(x))


# ---- modes and options --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_every_documented_mode_is_accepted(mode):
    x = torch.randn(3)
    warns = pytest.warns(UserWarning, match=rf"ember: mode='{mode}' has no effect on CPU tensors .*"
                         "the graph compiles with the default settings")
    with warns if mode not in (None, "default") else _no_warning():
        out = ember.compile(lambda t: t.cos(), mode=mode)(x)
    assert torch.equal(out, x.cos())


class _no_warning:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def test_mode_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"unknown mode 'fast'; valid modes: None, 'default', 'reduce-overhead'"):
        ember.compile(lambda x: x, mode="fast")
    with pytest.raises(RuntimeError, match="Either mode or options can be specified"):
        ember.compile(lambda x: x, mode="max-autotune", options={"guard_filter_fn": None})
    with pytest.raises(ValueError, match=r"backend 'eager' does not take a mode.*'ember' backend"):
        ember.compile(lambda x: x, backend="eager", mode="reduce-overhead")


def test_unknown_option_keys_are_named_with_the_valid_ones():
    declared = registry.OptionSpec(int, 4, "how many")
    ember.register_backend(lambda gm, ex, options=None: gm.forward, name="with_opts", options={"n": declared})
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'bogus' for backend 'with_opts'; valid options: n "):
        ember.compile(lambda x: x, backend="with_opts", options={"bogus": 1})
    with pytest.raises(TypeError, match=r"option 'n' of backend 'with_opts' must be int"):
        ember.compile(lambda x: x, backend="with_opts", options={"n": "four"})
    # the ember backend (alias inductor) takes torch.compile's inductor option names; a typo is named
    ember.compile(lambda x: x, options={"triton.cudagraphs": True})
    with pytest.raises(ValueError, match=r"unknown option 'triton.cudagrahps' for backend 'ember' \(did you mean "
                                         r"'triton.cudagraphs'\?\)"):
        ember.compile(lambda x: x, options={"triton.cudagrahps": True})


def test_options_reach_backends_the_way_torch_compile_passes_them():
    got = []

    def third_party(gm, example_inputs, **kwargs):  # declares no options: passed through unchecked
        got.append(kwargs)
        return gm.forward

    ember.register_backend(third_party, name="third_party")
    x = torch.randn(2)
    ember.compile(lambda t: t * 3, backend="third_party", options={"anything": 1})(x)
    ember.compile(lambda t: t * 3, backend="third_party", mode="max-autotune")(x)
    ember.compile(lambda t: t * 3, backend="third_party")(x)
    assert got == [{"options": {"anything": 1}}, {"mode": "max-autotune"}, {}]


# ---- stance -------------------------------------------------------------------------------------
def _counted(fn, backend=None):
    cnt = backend or CompileCounter()
    return ember.compile(fn, backend=cnt), cnt


def test_force_eager_as_decorator_context_manager_and_function():
    # torch.compiler.set_stance's documentation example, adapted
    foo, cnt = _counted(lambda x: x * 2 + 1)
    x = torch.randn(4)

    @ember.set_stance("force_eager")
    def bar(t):
        return foo(t)  # will not be compiled

    assert torch.equal(bar(x), x * 2 + 1) and cnt.frame_count == 0
    with ember.set_stance("force_eager"):
        assert torch.equal(foo(x), x * 2 + 1)  # will also not be compiled
    assert cnt.frame_count == 0
    ember.set_stance("force_eager")
    foo(x)  # will also not be compiled
    assert cnt.frame_count == 0
    ember.set_stance("default")
    assert torch.equal(foo(x), x * 2 + 1) and cnt.frame_count == 1  # will be compiled


def test_eager_on_recompile_uses_cached_code_and_never_compiles():
    f, cnt = _counted(lambda x: x.sin())
    a, b = torch.randn(4), torch.randn(5)
    f(a)
    with ember.set_stance("eager_on_recompile"):
        assert torch.equal(f(b), b.sin())  # a new shape: eager, no compile
        assert torch.equal(f(a), a.sin())
    assert cnt.frame_count == 1 and cache_of(f).compile_count == 1
    f(b)
    assert cnt.frame_count == 2


def test_fail_on_recompile_raises_with_the_reason():
    f, cnt = _counted(lambda x: x.sin())
    f(torch.randn(4))
    with ember.set_stance("fail_on_recompile"):
        f(torch.randn(4))  # cached: fine
        with pytest.raises(RuntimeError, match=r"fail_on_recompile.*x.shape\[0\] changed: 4 -> 6.*Warm it up"):
            f(torch.randn(6))
    assert cnt.frame_count == 1


def test_eager_then_compile_runs_the_first_call_eagerly():
    f, cnt = _counted(lambda x: x.exp())
    with ember.set_stance("eager_then_compile"):
        x = torch.randn(3)
        f(x)
        assert cnt.frame_count == 0
        assert torch.equal(f(x), x.exp()) and cnt.frame_count == 1


def test_force_backend_compiles_with_that_backend_in_separate_entries():
    own, forced = CompileCounter(), CompileCounter()
    f = ember.compile(lambda x: x + 1, backend=own)
    x = torch.randn(2)
    with ember.set_stance(force_backend=forced):
        f(x)
    f(x)
    assert (own.frame_count, forced.frame_count) == (1, 1)
    with pytest.raises(RuntimeError, match="non-default stance cannot have force_backend"):
        ember.set_stance("force_eager", force_backend="eager")


def test_unknown_stance_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown stance 'lazy'; valid stances: 'default'.*'force_eager'"):
        ember.set_stance("lazy")


@pytest.mark.parametrize("fullgraph", [False, True])
def test_set_stance_inside_compiled_code_raises(fullgraph):
    def f(x):
        ember.set_stance("force_eager")
        return x + 1

    with pytest.raises(ember.CompileError, match=r"set_stance\(\) cannot be called inside a compiled function.*test_api_surface.py"):
        ember.compile(f, fullgraph=fullgraph)(torch.randn(2))
    assert ember.frontend.stance.current is ember.frontend.stance.DEFAULT


def test_skip_guard_eval_unsafe_checks_only_differentiating_guards():
    f, cnt = _counted(lambda x: x * 2)
    f(torch.randn(4))
    f(torch.randn(4, dtype=torch.float64))
    with ember.set_stance(skip_guard_eval_unsafe=True):
        out = f(torch.ones(4, dtype=torch.float64))
        assert out.dtype == torch.float64  # the dtype guard tells the two entries apart: kept
        out = f(torch.ones(7))  # shapes are not differentiating: no recompile (the unsafe part)
        assert out.shape == (7,) and out.dtype == torch.float32
    assert cnt.frame_count == 2
    with pytest.raises(RuntimeError, match="would be compiled here"):
        with ember.set_stance("fail_on_recompile"):
            f(torch.ones(7))  # guards are back once the stance is restored


# ---- disable, reset, is_compiling ---------------------------------------------------------------
def test_disable_never_compiles_the_function():
    cnt = CompileCounter()
    f = ember.compile(lambda x: x + 1, backend=cnt)
    g = ember.disable(f)
    assert torch.equal(g(torch.ones(2)), torch.full((2,), 2.0)) and cnt.frame_count == 0


def test_disable_recursive_controls_nested_compiled_callables():
    inner, cnt = _counted(lambda x: x * 5)

    @ember.disable
    def outer_rec(x):
        return inner(x)

    @ember.disable(recursive=False)
    def outer_flat(x):
        return inner(x)

    x = torch.randn(3)
    assert torch.equal(outer_rec(x), x * 5) and cnt.frame_count == 0
    assert torch.equal(outer_flat(x), x * 5) and cnt.frame_count == 1


def test_disabled_callee_runs_as_python_with_the_same_result():
    seen = []

    @ember.disable
    def log_shape(t):
        seen.append(tuple(t.shape))
        return t

    def f(x):
        return log_shape(x * 2) + 1

    x = torch.randn(3)
    c = ember.compile(f)
    out = c(x)
    assert torch.equal(out, x * 2 + 1) and seen == [(3,)]
    (brk,) = cache_of(c).entries[0].breaks  # a graph break at the call: the rest is compiled
    assert "marked with ember.disable" in brk.reason
    with pytest.raises(ember.CompileError, match="log_shape is marked with ember.disable"):
        ember.compile(f, fullgraph=True)(x)


def test_disable_on_a_module_and_as_identity_for_none():
    m = torch.nn.Linear(2, 2)
    assert ember.disable(m) is m and "forward" in m.__dict__
    assert callable(ember.disable())


def test_reset_forgets_compiled_code():
    f, cnt = _counted(lambda x: x - 1)
    x = torch.randn(2)
    f(x)
    f(x)
    ember.reset()
    assert cache_of(f).entries == []
    f(x)
    assert cnt.frame_count == 2


def test_is_compiling_and_is_exporting():
    def f(x):
        return x + 1 if ember.is_compiling() else x - 1

    x = torch.zeros(1)
    assert not ember.is_compiling() and not ember.is_exporting()
    assert f(x).item() == -1 and ember.compile(f)(x).item() == 1
    assert ember.compile(lambda t: t + int(ember.is_exporting()), fullgraph=True)(x).item() == 0


# ---- allow_in_graph / substitute_in_graph -------------------------------------------------------
def _untraceable_scale(x, k):
    # zlib.crc32 is a C function ember cannot trace: without allow_in_graph this frame falls back
    return x * (k + zlib.crc32(b""))


def test_allow_in_graph_puts_the_function_in_the_graph_whole():
    def f(x):
        return _untraceable_scale(x.relu(), 3) + 1

    x = torch.randn(5)
    with pytest.raises(ember.CompileError):
        ember.compile(f, fullgraph=True)(x)
    assert ember.allow_in_graph(_untraceable_scale) is _untraceable_scale
    cnt = CompileCounter()
    out = ember.compile(f, backend=cnt, fullgraph=True)(x)
    assert torch.equal(out, f(x))
    targets = [n.target for n in cnt.graphs[0].graph.nodes if n.op == "call_function"]
    assert _untraceable_scale in targets


def test_substitute_in_graph_operator_indexOf_fullgraph():
    # torch.compiler.substitute_in_graph's documentation example, adapted
    assert operator.indexOf([1, 2, 3, 4, 5], 3) == 2

    traced = []

    @ember.substitute_in_graph(operator.indexOf)
    def indexOf(a, b, /):
        traced.append(True)  # replayed as a side effect: proves the polyfill body was traced
        for i, item in enumerate(a):
            if item is b or item == b:
                return i
        raise ValueError("sequence.index(x): x not in sequence")

    assert ember.compile(operator.indexOf, fullgraph=True)([1, 2, 3, 4, 5], 3) == 2
    assert indexOf([7, 8], 8) == 1  # the returned function calls the original
    with pytest.raises(ValueError, match="already has a polyfill"):
        ember.substitute_in_graph(operator.indexOf)(indexOf)


def test_substitute_in_graph_makes_a_c_function_traceable():
    def f(x, edges):
        return x * bisect.bisect_left(edges, 2.5)

    x = torch.randn(3)
    with pytest.raises(ember.CompileError, match="bisect"):
        ember.compile(f, fullgraph=True)(x, [1.0, 2.0, 3.0])

    @ember.substitute_in_graph(bisect.bisect_left, skip_signature_check=True)
    def bisect_left(a, x, lo=0, hi=None, *, key=None):
        hi = len(a) if hi is None else hi
        while lo < hi:
            mid = (lo + hi) // 2
            if a[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo

    g = ember.compile(f, fullgraph=True)
    assert torch.equal(g(x, [1.0, 2.0, 3.0]), x * 2)
    assert torch.equal(g(x, [1.0, 2.0, 3.0, 4.0]), x * 2)


def test_substitute_in_graph_checks_the_signature():
    with pytest.raises(TypeError, match=r"signature mismatch between _operator.countOf\(a, b, /\).*\(a, c\)"):
        @ember.substitute_in_graph(operator.countOf)
        def countOf(a, c):
            return 0
    with pytest.raises(TypeError, match="must be a Python function"):
        ember.substitute_in_graph(operator.concat)(len)


def test_substitute_in_graph_can_constant_fold_through():
    import math

    @ember.substitute_in_graph(math.gcd, can_constant_fold_through=True, skip_signature_check=True)
    def gcd(*integers):
        raise AssertionError("not traced: constant arguments fold through the original")

    assert ember.compile(lambda x: x * math.gcd(12, 18), fullgraph=True)(torch.ones(1)).item() == 6


# ---- guard control ------------------------------------------------------------------------------
SCALE = 2.0


def _uses_global(x):
    return x * SCALE


def test_guard_filter_fn_receives_torch_style_entries():
    seen = []

    def keep_all(entries):
        seen.extend(entries)
        return [True] * len(entries)

    m = torch.nn.Linear(2, 2)
    ember.compile(m, options={"guard_filter_fn": keep_all})(torch.randn(1, 2))
    by_name = {e.name: e for e in seen}
    assert by_name["self.weight"].guard_type == "TENSOR_MATCH" and by_name["self.weight"].value is m.weight
    assert by_name["self.weight"].is_builtin_nn_module and by_name["self.weight"].is_nn_module
    assert by_name["input"].guard_type == "TENSOR_MATCH" and not by_name["input"].is_nn_module
    assert any(e.guard_type == "GLOBAL_STATE" for e in seen)
    with pytest.raises(ValueError, match="one bool per entry"):
        ember.compile(lambda x: x + 1, options={"guard_filter_fn": lambda es: []})(torch.randn(1))


def test_skip_all_guards_unsafe_never_recompiles():
    f, cnt = None, CompileCounter()
    f = ember.compile(lambda x: x * 2, backend=cnt, options={"guard_filter_fn": ember.skip_all_guards_unsafe})
    f(torch.randn(3))
    assert torch.equal(f(torch.ones(6)), torch.full((6,), 2.0))
    assert cnt.frame_count == 1 and len(cache_of(f).entries[0].guards) == 0


def test_skip_guard_on_globals_unsafe():
    global SCALE
    plain = ember.compile(_uses_global)
    skipping = ember.compile(_uses_global, options={"guard_filter_fn": ember.skip_guard_on_globals_unsafe})
    x = torch.ones(2)
    plain(x), skipping(x)
    try:
        SCALE = 3.0
        assert plain(x)[0].item() == 3.0  # guarded: recompiles
        assert skipping(x)[0].item() == 2.0  # unguarded: keeps the traced value (the documented risk)
    finally:
        SCALE = 2.0


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = 2

    def forward(self, x):
        return self.lin(x) * self.scale


def _guard_names(compiled):
    """Guarded values reached from the inputs (globals such as torch.nn.functional are left out)."""
    names = {g.source.name() for g in cache_of(compiled).entries[0].guards if g.source is not None}
    return {n for n in names if n == "x" or n.startswith("self")}


def test_nn_module_guard_helpers():
    x = torch.randn(2, 3)
    full = ember.compile(_Net())
    full(x)
    assert {"self.lin.weight", "self.scale", "x"} <= _guard_names(full)

    inbuilt = ember.compile(_Net(), options={"guard_filter_fn": ember.skip_guard_on_inbuilt_nn_modules_unsafe})
    inbuilt(x)
    names = _guard_names(inbuilt)
    assert "self.scale" in names and "x" in names and not any(n.startswith("self.lin") for n in names)

    allmods = ember.compile(_Net(), options={"guard_filter_fn": ember.skip_guard_on_all_nn_modules_unsafe})
    allmods(x)
    assert _guard_names(allmods) == {"x"}

    tensors = ember.compile(_Net(), options={"guard_filter_fn": ember.keep_tensor_guards_unsafe})
    tensors(x)
    assert _guard_names(tensors) == {"x"}  # parameters dropped unless keep_parameters=True
    params_too = ember.compile(_Net(), options={
        "guard_filter_fn": lambda es: ember.keep_tensor_guards_unsafe(es, keep_parameters=True)})
    params_too(x)
    assert _guard_names(params_too) == {"x", "self.lin.weight", "self.lin.bias"}
    for c in (inbuilt, allmods, tensors, params_too):
        assert torch.allclose(c(x), c._orig_mod(x))
