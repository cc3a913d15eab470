"""`ember run`'s translation of the torch.compile surface (ember/dropin), in process: the session is
entered directly, around the statements a script would run."""
from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

import ember
from ember.backends import inductor_options
from ember.diagnostics import counters
from ember.diagnostics import logging as elog
from ember.dropin import Session, functions, tables
from ember.dropin.session import ConfigProxy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def notices(monkeypatch):
    """The one-time notices said during the test (each test starts with none said)."""
    said = []
    monkeypatch.setattr(elog, "_noticed", set())
    monkeypatch.setattr(elog._notice, "info", lambda text: said.append(text))
    return said


def test_import_torch_dynamo_inside_the_run_gets_ember_functions_and_config(notices):
    limit = ember.config.recompile_limit
    with Session():
        import torch._dynamo  # what the script does: the real package, with ember's names on it

        assert torch._dynamo.mark_dynamic is functions.mark_dynamic
        assert torch._dynamo.reset is ember.reset
        assert isinstance(torch._dynamo.config, ConfigProxy)
        from torch._dynamo import config as cfg  # noqa: I001 - every spelling reaches the proxy
        import torch._dynamo.config as cfg2

        assert cfg is cfg2 is torch._dynamo.config
        torch._dynamo.config.cache_size_limit = 33
        assert ember.config.recompile_limit == 33 and torch._dynamo.config.cache_size_limit == 33
        torch._dynamo.config.suppress_errors = True
        assert ember.config.suppress_errors is True
        torch._dynamo.config.skip_nnmodule_hook_guards = False  # no ember meaning: one notice
        torch._dynamo.config.skip_nnmodule_hook_guards = False
        with pytest.raises(AttributeError):  # torch itself checks the name, as without ember
            torch._dynamo.config.no_such_knob = 1
        assert torch.compile is not ember.compile and torch.compile.__wrapped__ is ember.compile
    # all put back
    assert ember.config.recompile_limit == limit and ember.config.suppress_errors is False
    assert not isinstance(torch._dynamo.config, ConfigProxy)
    assert torch._dynamo.mark_dynamic is not functions.mark_dynamic
    assert torch.compile is not functions.wraps_compile
    assert [n for n in notices if "skip_nnmodule_hook_guards" in n] == [
        "torch._dynamo.config.skip_nnmodule_hook_guards = False: accepted; no ember equivalent; ignored"]


def test_config_patch_goes_through_the_translation():
    import torch._dynamo

    limit = ember.config.recompile_limit
    with Session():
        with torch._dynamo.config.patch(cache_size_limit=5):
            assert ember.config.recompile_limit == 5
        assert ember.config.recompile_limit == limit

        @torch._dynamo.config.patch("recompile_limit", 3)
        def inner():
            return ember.config.recompile_limit

        assert inner() == 3 and ember.config.recompile_limit == limit


def test_mark_dynamic_makes_the_dimension_symbolic_from_the_first_compile():
    import torch._dynamo

    def run(mark):
        seen = []

        def backend(gm, example_inputs):
            seen.append([tuple(n.meta["example_value"].shape) for n in gm.graph.nodes if n.op == "placeholder"])
            return gm.forward

        with Session():
            f = torch.compile(lambda x: (x * 2).sum(0), backend=backend)
            for n in (3, 5, 9):
                x = torch.ones(n, 4)
                if mark:
                    torch._dynamo.mark_dynamic(x, 0)
                assert f(x).tolist() == [2.0 * n] * 4
        return seen

    marked = run(True)
    assert len(marked) == 1  # no recompile across sizes
    assert isinstance(marked[0][0][0], torch.SymInt) and marked[0][0][1] == 4
    unmarked = run(False)
    assert len(unmarked) == 2 and unmarked[0][0] == (3, 4)  # static first, automatic dynamic after


def test_automatic_dynamic_shapes_off_and_assume_static_by_default_off():
    import torch._dynamo

    def compiles(**knobs):
        before = counters.compiled_snapshot()
        with Session():
            for k, v in knobs.items():
                setattr(torch._dynamo.config, k, v)
            f = torch.compile(lambda x: x + 1, backend="eager")
            for n in (2, 3, 4):
                f(torch.ones(n))
        return (counters.compiled_snapshot() - before)["graphs_compiled"]

    assert compiles() == 2
    assert compiles(automatic_dynamic_shapes=False) == 3
    assert compiles(assume_static_by_default=False) == 1


def test_dynamo_disable_knob_runs_compiled_functions_as_python():
    import torch._dynamo

    before = counters.compiled_snapshot()
    with Session():
        torch._dynamo.config.disable = True
        assert torch.compile(lambda x: x * 3)(torch.ones(1)).tolist() == [3.0]
    assert (counters.compiled_snapshot() - before)["graphs_compiled"] == 0
    assert ember.compile(lambda x: x * 3)(torch.ones(1)).tolist() == [3.0]  # stance put back


def test_inductor_config_settings_reach_the_ember_backend(notices):
    with Session():
        import torch._inductor.config as ic

        assert isinstance(ic, ConfigProxy)
        ic.max_autotune = True
        ic.triton.cudagraphs = True  # nested torch config: the proxy sees the dotted name
        ic.epilogue_fusion = False
        assert inductor_options.GLOBAL == {"max_autotune": True, "triton.cudagraphs": True}
        tr = inductor_options.translate({"shape_padding": False})
        assert (tr.autotune, tr.cudagraphs, tr.native) == (True, True, {"pad_mm": False})
        assert ic.max_autotune is True  # torch's own config holds the value too
    assert inductor_options.GLOBAL == {}
    assert any(n.startswith("torch._inductor.config.epilogue_fusion = False: accepted") for n in notices)


def test_inductor_option_names_outside_and_inside_ember_run(notices):
    x = torch.linspace(-1, 1, 5)
    f = ember.compile(lambda t: t.sin(), options={"epilogue_fusion": True, "max_autotune": False,
                                                  "fx_graph_cache": False, "freezing": False})
    torch.testing.assert_close(f(x), x.sin())  # compiled kernels: equal up to rounding
    assert any("inductor option freezing=False accepted" in n for n in notices)
    with pytest.raises(ValueError, match=r"unknown option 'epilogue_fussion' .*did you mean 'epilogue_fusion'"):
        ember.compile(lambda t: t, options={"epilogue_fussion": True})
    with pytest.raises(TypeError, match=r"option 'max_autotune' of backend 'ember' must be True or False"):
        ember.compile(lambda t: t, options={"max_autotune": "yes"})
    with Session():  # a script may target a newer torch: an unseen name is a notice there
        g = torch.compile(lambda t: t.cos(), options={"some_future_option": 1})
        torch.testing.assert_close(g(x), x.cos())
    assert any("some_future_option=1 is not an inductor option" in n for n in notices)


def test_inductor_names_file_matches_the_installed_torch():
    import sys

    sys.path.insert(0, str(REPO / "tools"))
    try:
        from gen_inductor_names import current_names
    finally:
        sys.path.pop(0)
    assert set(current_names()) == set(inductor_options.inductor_names()), \
        "ember/backends/inductor_names.txt is stale: run python tools/gen_inductor_names.py"
    assert set(inductor_options.MEANINGS) <= inductor_options.inductor_names()


def test_every_dynamo_config_knob_in_the_table_is_a_real_one():
    import torch._dynamo.config as real

    assert set(tables.DYNAMO_CONFIG) <= set(real._config), set(tables.DYNAMO_CONFIG) - set(real._config)


def test_explain_and_optimize_and_graph_break():
    import torch._dynamo

    def f(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    with Session():
        report = torch._dynamo.explain(f)(torch.ones(2))
        assert (report.graph_count, report.graph_break_count) == (2, 1)
        assert torch._dynamo.explain(f, torch.ones(2)).graph_count == 2  # the older spelling
        g = torch._dynamo.optimize("eager", nopython=True)(lambda x: x + 1)
        assert g(torch.zeros(1)).tolist() == [1.0]
        # optimize_assert (torch._dynamo.testing.standard_test's) is ember's too: one graph or an error
        h = torch._dynamo.optimize_assert("eager")(f)
        assert "ember" in type(h).__module__ or "ember" in getattr(h, "__module__", "")
        with pytest.raises(ember.CompileError):
            h(torch.ones(2))


def test_recompile_limit_warning_points_at_the_user_line_and_fits_what_changed():
    ember.config.recompile_limit = 2
    try:
        f = ember.compile(lambda x, n: x * n, dynamic=False)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for n in range(4):
                f(torch.ones(2), n)  # the line the warning names
        (msg,) = [x for x in w if "recompile limit" in str(x.message)]
        assert msg.filename == __file__
        assert "the int argument n changed value" in str(msg.message)
        assert "mark the changing dimension dynamic" not in str(msg.message)

        class M(torch.nn.Module):
            k = 1

            def forward(self, x):
                return x * self.k

        m = M()
        cm = ember.compile(m)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for k in range(4):
                m.k = k
                cm(torch.ones(2))
        (msg,) = [x for x in w if "recompile limit" in str(x.message)]
        assert msg.filename == __file__ and "self.k is an int attribute" in str(msg.message)

        g = ember.compile(lambda x: x + 1, dynamic=False)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for n in range(2, 6):
                g(torch.ones(n))
        (msg,) = [x for x in w if "recompile limit" in str(x.message)]
        assert msg.filename == __file__ and "mark the changing dimension dynamic" in str(msg.message)
    finally:
        ember.config.recompile_limit = 8


def test_explain_lists_guards_of_resumed_code_by_the_users_names():
    def f(x, n):
        y = x.sin() * n
        print("break")
        return y.cos() + x

    text = str(ember.explain(f)(torch.ones(2), 3))
    assert "__ember" not in text
    resumed = text[re.search(r"Guards of \S*f \(resumed", text).start():]
    assert re.search(r"^  x: TENSOR$", resumed, re.M) and re.search(r"^  y: TENSOR$", resumed, re.M)


def test_docs_show_the_current_tables():
    doc = (REPO / "docs" / "dropin.md").read_text()
    assert tables.markdown_tables() in doc, "docs/dropin.md is stale: paste ember.dropin.tables.markdown_tables()"
    assert inductor_options.markdown_table() in doc, \
        "docs/dropin.md is stale: paste ember.backends.inductor_options.markdown_table()"


def test_the_test_extra_does_not_install_torchao():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(d.startswith("torchao") for d in extras["test"])
    assert any(d.startswith("torchao") for d in extras["pt2e"])


def test_the_documented_tables_name_exactly_what_is_routed():
    import torch._dynamo

    assert set(tables.DYNAMO_FUNCTIONS) == set(functions.DYNAMO) | {"config"}
    assert set(tables.COMPILER_FUNCTIONS) == set(functions.compiler_routes()) | {"compile"}
    for name in functions.compiler_routes():
        assert hasattr(torch.compiler, name), f"torch.compiler has no {name}: nothing to route"
    for name in functions.DYNAMO:
        assert hasattr(torch._dynamo, name), f"torch._dynamo has no {name}: nothing to route"


def test_a_torch_compile_checkpoint_loads_into_an_ember_compiled_module():
    src, dst = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    saved = {f"_orig_mod.{k}": v for k, v in src.state_dict().items()}  # what torch.compile's wrapper saves
    ember.compile(dst).load_state_dict(saved)
    assert torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)


def test_use_numpy_random_stream_maps_to_ember_config(notices):
    assert ember.config.use_numpy_random_stream is False
    with Session():
        import torch._dynamo

        torch._dynamo.config.use_numpy_random_stream = True
        assert ember.config.use_numpy_random_stream is True
    assert ember.config.use_numpy_random_stream is False


def test_mock_patch_of_a_config_setting_is_undone_through_the_translation():
    """unittest.mock.patch deletes the setting on exit and then sets the saved value back (PyTorch's
    own tests patch torch._dynamo.config this way); the proxy raised AttributeError on the delete."""
    from unittest import mock

    import torch._dynamo

    limit = ember.config.recompile_limit
    with Session():
        before = torch._dynamo.config.suppress_errors
        with mock.patch.object(torch._dynamo.config, "cache_size_limit", 5):
            assert ember.config.recompile_limit == 5
        assert ember.config.recompile_limit == limit
        with mock.patch("torch._dynamo.config.suppress_errors", not before):
            assert torch._dynamo.config.suppress_errors is (not before)
        assert torch._dynamo.config.suppress_errors is before
