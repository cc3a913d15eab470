"""Constructs Hugging Face models use, traced without graph breaks (issue 8: the model zoo).

Each test compares with eager and asserts the trace has no graph break; the pure-Python versions
mirror what transformers does (configs copied and rewritten, lru_cache'd probes, jit-scripted
helpers, autograd.Functions, modules made inside forward), so they run without transformers too.
"""
import copy
import functools
import logging

import pytest
import torch

import ember


def _explain(fn, *args):
    report = ember.explain(fn)(*args)
    assert report.graph_break_count == 0 and not report.fallbacks, report.break_reasons or report.fallbacks
    return report


# ---- configs: copy.deepcopy, aliases through __getattribute__, __setattr__, delattr, __dict__ ------
class Config:
    attribute_map = {"hidden_size": "d_model"}

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def to_dict(self):
        return copy.deepcopy(self.__dict__)

    def decoder_view(self):
        """transformers' get_text_config(decoder=True) for flat configs: a copy with renamed keys."""
        out = copy.deepcopy(self)
        for key in out.to_dict():
            if key.startswith("decoder_"):
                value = getattr(out, key)
                delattr(out, key)
                setattr(out, key[len("decoder_"):], value)
        return out


def test_deepcopy_of_a_config_and_rewriting_the_copy():
    cfg = Config(d_model=4, decoder_scale=3.0, layers=[1, 2], extra={"a": (1, 2)})

    def f(x):
        view = cfg.decoder_view()
        assert not hasattr(view, "decoder_scale") and view.layers is not cfg.layers
        return x * view.scale + view.hidden_size + len(view.layers) + view.extra["a"][1]

    x = torch.randn(3)
    report = _explain(f, x)
    torch.testing.assert_close(report.out, f(x))
    assert cfg.decoder_scale == 3.0 and not hasattr(cfg, "scale")  # the original is untouched
    compiled = ember.compile(f)
    torch.testing.assert_close(compiled(x), f(x))
    cfg.decoder_scale = 5.0  # the copy read every attribute under a guard: this recompiles
    torch.testing.assert_close(compiled(x), x * 5.0 + 4 + 2 + 2)


def test_copied_object_escapes_with_its_attributes():
    cfg = Config(d_model=2, decoder_scale=1.5)

    def f(x):
        view = cfg.decoder_view()
        view.hidden_size = 7
        return x + view.scale, view

    out, view = _explain(f, torch.ones(2)).out
    assert type(view) is Config and view is not cfg
    assert vars(view) == {"d_model": 7, "scale": 1.5} and cfg.d_model == 2


def test_id_of_an_existing_object_and_copy_copy():
    cfg = Config(d_model=2)

    def f(x):
        memo = {id(cfg): 3}
        shallow = copy.copy(cfg)
        shallow.d_model = 5
        return x * memo[id(cfg)] + cfg.d_model + shallow.hidden_size

    x = torch.randn(2)
    torch.testing.assert_close(_explain(f, x).out, f(x))


def test_dict_of_an_object_made_in_the_trace():
    class Box:
        pass

    def f(x):
        b = Box()
        b.scale = 2
        b.__dict__["shift"] = 3   # writes through __dict__ are attributes
        vars(b)["scale"] += 1     # and vars() is the same dict
        return x * b.scale + b.shift + len(b.__dict__)

    x = torch.randn(2)
    torch.testing.assert_close(_explain(f, x).out, f(x))


def test_real_transformers_config_get_text_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BartConfig(vocab_size=10, d_model=8, encoder_layers=2, decoder_layers=3,
                                  encoder_attention_heads=2, decoder_attention_heads=2)

    def f(x):
        text = cfg.get_text_config(decoder=True)
        return x * text.num_hidden_layers

    x = torch.randn(2)
    torch.testing.assert_close(_explain(f, x).out, x * 3)


# ---- ModelOutput objects from outside the compiled function -------------------------------------
def test_model_output_from_outside():
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")
    out = modeling_outputs.BaseModelOutput(last_hidden_state=torch.randn(2, 3), hidden_states=(torch.randn(2, 3),))

    def f(o, x):
        t = o.to_tuple()
        return o[0] * x + t[1][0] + len(o.keys()) + o.last_hidden_state, o.attentions is None, list(o.keys())

    x = torch.randn(3)
    got, want = _explain(f, out, x).out, f(out, x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:]


# ---- lru_cache'd helpers ------------------------------------------------------------------------
def test_lru_cache_helpers():
    calls = []

    @functools.lru_cache
    def probe(name):
        calls.append(name)
        return len(name)

    @functools.lru_cache
    def scaled(x, k):
        return x * k

    def f(x):
        return scaled(x, probe("abc")) + probe("abc")

    x = torch.randn(2)
    torch.testing.assert_close(_explain(f, x).out, x * 3 + 3)
    assert calls == ["abc"]  # once, as eager's cache would: the compiled code reuses the answer


class _OnceLogger(logging.Logger):
    """transformers' ``logger.warning_once``: an lru_cache'd method (transformers sets it on
    ``logging.Logger`` itself; a subclass keeps this test from touching every logger)."""

    @functools.lru_cache(None)
    def warning_once(self, *args):
        self.warning(*args)


def test_logger_warning_once_prints_once_without_a_graph_break():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = _OnceLogger("ember-test-warning-once")
    log.addHandler(Keep())
    log.propagate = False

    def f(x, kind):
        log.warning_once(f"`loss_type={kind}` is unrecognized")
        return x * 2

    x = torch.randn(3)
    report = _explain(f, x, None)  # no graph break: logging's lock is never traced
    torch.testing.assert_close(report.out, x * 2)
    compiled = ember.compile(f)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, None), x * 2)
    compiled(x, "other")  # a new message: printed once more, as eager would
    compiled(x, "other")
    assert records == ["`loss_type=None` is unrecognized", "`loss_type=other` is unrecognized"]
    other = _OnceLogger("ember-test-warning-once-2")  # the cached answer is for that logger only
    other.addHandler(Keep())
    other.propagate = False
    log_before = log

    def g(x, lg):
        lg.warning_once("hello")
        return x + 1

    cg = ember.compile(g)
    cg(x, log_before)
    cg(x, other)
    cg(x, other)
    assert records[2:] == ["hello", "hello"]


# ---- torch.jit.script helpers -------------------------------------------------------------------
@torch.jit.script
def _scaled_size_sqrt(q: torch.Tensor, scale_factor: int):
    return torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * scale_factor)


def test_jit_script_function_is_traced_through_its_python():
    def f(q):
        return q / _scaled_size_sqrt(q, 2)

    q = torch.randn(2, 8)
    torch.testing.assert_close(_explain(f, q).out, f(q))


# ---- torch.autograd.Function (bloom's GeLU) -------------------------------------------------------
class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 100.0  # not the true derivative: shows whose backward ran


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def test_autograd_function_without_grad_is_inlined():
    def f(x):
        y = _Identity.apply(x)
        return _Gelu.apply(x) + 1, y is x

    x = torch.randn(4)
    with torch.no_grad():
        got, want = _explain(f, x).out, f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] is want[1] is False  # apply hands back a view, never the input itself


def test_autograd_function_with_grad_breaks_and_keeps_its_backward():
    def f(x):
        return _Gelu.apply(x * 2).sum()

    x = torch.randn(4, requires_grad=True)
    report = ember.explain(f)(x)
    assert report.graph_break_count == 1 and "require grad" in report.break_reasons[0].reason
    x2 = x.detach().clone().requires_grad_()
    ember.compile(f)(x2).backward()
    torch.testing.assert_close(x2.grad, torch.full((4,), 200.0))


def test_zero_argument_super_in_code_that_runs_natively_after_a_break():
    class D(dict):
        def total(self, x):
            for _ in range(2):
                print("a print in a loop: the loop runs as Python")
                x = x + super().get("a")
            return x

    d = D(a=2)
    torch.testing.assert_close(ember.compile(lambda x: d.total(x))(torch.ones(2)), torch.full((2,), 5.0))


# ---- modules made inside forward (codegen's nn.Softmax(dim=-1)(w)) ------------------------------
def test_stateless_torch_module_made_in_forward():
    def f(x):
        return torch.nn.Softmax(dim=-1)(x) + torch.nn.Dropout(p=0.0)(x), torch.nn.GELU()

    x = torch.randn(2, 5)
    rng = torch.get_rng_state()
    (got, act), (want, _) = _explain(f, x).out, f(x)
    torch.testing.assert_close(got, want)
    assert isinstance(act, torch.nn.GELU)
    assert torch.equal(torch.get_rng_state(), rng)


def test_module_with_parameters_made_in_forward_breaks_and_draws_like_eager():
    def f(x):
        return torch.nn.Linear(3, 3)(x)

    x = torch.randn(2, 3)
    torch.manual_seed(1)
    want = f(x)
    torch.manual_seed(1)
    report = ember.explain(f)(x)  # made natively, so its initial values come from the same draws
    assert report.graph_break_count >= 1
    torch.testing.assert_close(report.out, want)
