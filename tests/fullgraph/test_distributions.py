"""``torch.distributions`` objects built and used inside the compiled function (Normal,
Categorical, Bernoulli, Uniform): their Python code is inlined; the argument validation they run
by default is asserted when the graph runs (ember/frontend/variables/distributions.py)."""
import pytest
import torch

from .harness import Cases, run, t

D = torch.distributions
cases = Cases("distributions")


def x1():
    return (t(4, grad=True),)


@cases.case(x1)
def normal(x):
    d = D.Normal(x, x.abs() + 0.5)
    return d.log_prob(x * 0.3), d.entropy(), d.mean, d.stddev, d.cdf(x + 0.1), d.variance


@cases.case(x1)
def normal_rsample(x):
    d = D.Normal(x, 1.0)
    return d.rsample((2,)), d.batch_shape, d.event_shape


@cases.case(x1, atol=1e-5, rtol=1e-5)
def categorical(x):
    d = D.Categorical(logits=x)
    p = D.Categorical(probs=x.softmax(-1))
    return d.entropy(), d.log_prob(torch.tensor(1)), p.probs, p.logits, d.probs * 2, d.param_shape


@cases.case(x1)
def bernoulli(x):
    d = D.Bernoulli(logits=x)
    q = D.Bernoulli(probs=x.sigmoid())
    return d.log_prob((x > 0).float()), q.entropy(), q.mean, q.variance, d.probs


@cases.case(x1)
def uniform(x):
    d = D.Uniform(x - 1, x + 1)
    return d.log_prob(x), d.entropy(), d.variance, D.Uniform(0.0, 2.0).entropy() * x, d.rsample()


@cases.case(x1)
def without_validation(x):
    d = D.Normal(x, x.exp(), validate_args=False)
    return d.log_prob(x)


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_invalid_argument_raises_at_run_time(backend):
    # eager raises ValueError from the validation; compiled, the check is an assert in the graph
    import ember

    def f(x, scale):
        return D.Normal(x, scale).log_prob(x)

    cf = ember.compile(f, fullgraph=True, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, torch.ones(3)), f(x, torch.ones(3)))
    with pytest.raises(ValueError):
        f(x, -torch.ones(3))
    with pytest.raises(RuntimeError, match="torch.distributions argument check"):
        cf(x, -torch.ones(3))


def test_is_all_true_outside_distributions_still_breaks():
    import ember

    def f(x):
        if torch._is_all_true(x > 0):
            return x
        return -x

    with pytest.raises(ember.CompileError, match="branching on a tensor"):
        ember.compile(f, fullgraph=True)(torch.randn(3))
