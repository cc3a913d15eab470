"""Bad settings are rejected where they are made, naming what is valid: ``ember.config`` attributes,
``EMBER_*`` environment variables (named in the error) and the arguments of ``ember.compile``."""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import ember
from ember.config import Config

BOOL_SPELLINGS = {"1": True, "true": True, "yes": True, "on": True,
                  "0": False, "false": False, "no": False, "off": False}

FIELDS = {f.name: f for f in dataclasses.fields(Config)}
BOOL_FIELDS = [n for n, f in FIELDS.items() if type(f.default) is bool]
INT_FIELDS = [n for n, f in FIELDS.items() if type(f.default) is int]
STR_FIELDS = [n for n, f in FIELDS.items() if type(f.default) is str]


def f(x):
    return torch.sin(x) + 1


# ---- ember.config attributes ------------------------------------------------------------------------

def test_a_misspelled_setting_is_an_error_with_a_suggestion():
    before = dataclasses.asdict(ember.config)
    with pytest.raises(AttributeError, match=r"no setting 'recompile_limt'; did you mean 'recompile_limit'\?"):
        ember.config.recompile_limt = 3
    with pytest.raises(AttributeError, match=r"no setting 'supress_errors'; did you mean 'suppress_errors'\?"):
        ember.config.supress_errors  # noqa: B018 - reading a typo is as wrong as writing one
    with pytest.raises(AttributeError, match=r"no setting 'zzz'\. Settings: recompile_limit, .*cache_dir"):
        ember.config.zzz = 1
    assert dataclasses.asdict(ember.config) == before
    assert "recompile_limt" not in vars(ember.config)


@pytest.mark.parametrize("name, value, match", [
    *[(n, "lots", r"must be an int") for n in INT_FIELDS],
    *[(n, True, r"must be an int, got bool True") for n in INT_FIELDS],  # True is an int to isinstance
    *[(n, 2.0, r"must be an int, got float") for n in INT_FIELDS],
    *[(n, 1, r"must be True or False, got int 1") for n in BOOL_FIELDS],
    *[(n, "yes", r"must be True or False, got str 'yes'") for n in BOOL_FIELDS],
    *[(n, 3, r"must be a str, got int 3") for n in STR_FIELDS],
])
def test_a_wrongly_typed_setting_is_a_type_error(name, value, match):
    before = getattr(ember.config, name)
    with pytest.raises(TypeError, match=rf"ember\.config\.{name} {match}"):
        setattr(ember.config, name, value)
    assert getattr(ember.config, name) == before


@pytest.mark.parametrize("name, value, match", [
    ("recompile_limit", 0, r"must be >= 1, got int 0 \(recompile_limit: cache entries per compiled"),
    ("inline_depth_limit", 0, r"must be >= 1"),
    ("instruction_limit", 0, r"must be >= 1, got int 0 \(instruction_limit: bytecode instructions"),
    ("instruction_limit", -5, r"must be >= 1"),
    ("compile_threads", -1, r"must be >= 0"),
    ("cache_dir", "", r"must not be empty"),
    ("cache_dir", "   ", r"must not be empty"),
    ("logs", "graph_break", r"names unknown log artifact\(s\) 'graph_break' \(did you mean 'graph_breaks'\?\); "
                            r"valid: graph_breaks, recompiles, .*'all'"),
    ("logs", "guards,nope", r"names unknown log artifact\(s\) 'nope'"),
])
def test_an_out_of_range_setting_is_a_value_error(name, value, match):
    before = getattr(ember.config, name)
    with pytest.raises(ValueError, match=rf"ember\.config\.{name} {match}"):
        setattr(ember.config, name, value)
    assert getattr(ember.config, name) == before


@pytest.mark.parametrize("name, value", [
    ("recompile_limit", 1), ("compile_threads", 0), ("logs", "all"), ("logs", "guards, recompiles"), ("logs", ""),
    ("suppress_errors", True), ("verify", False), ("cache_dir", "/tmp/somewhere"),
])
def test_valid_settings_are_taken(monkeypatch, name, value):
    monkeypatch.setattr(ember.config, name, value)
    assert getattr(ember.config, name) == value


def test_the_constructor_checks_too():
    with pytest.raises(TypeError, match=r"ember\.config\.recompile_limit must be an int, got str 'lots'"):
        Config(recompile_limit="lots")
    with pytest.raises(ValueError, match=r"ember\.config\.instruction_limit must be >= 1"):
        Config(instruction_limit=0)


# ---- EMBER_* environment variables ------------------------------------------------------------------

@pytest.mark.parametrize("name", BOOL_FIELDS)
@pytest.mark.parametrize("raw", ["maybe", "2", "", "tru", "enabled"])
def test_garbage_in_a_boolean_variable_is_an_error_listing_the_spellings(name, raw):
    var = "EMBER_" + name.upper()
    with pytest.raises(ValueError, match=rf"{var}='{raw}' is not a boolean; accepted \(any case\): "
                                         r"1, true, yes, on for True, 0, false, no, off for False"):
        Config.from_env({var: raw})


@pytest.mark.parametrize("raw", sorted(BOOL_SPELLINGS) + ["TRUE", " Yes ", "Off"])
def test_every_accepted_boolean_spelling_parses(raw):
    got = Config.from_env({"EMBER_VERIFY": raw, "EMBER_SUPPRESS_ERRORS": raw})
    assert got.verify is got.suppress_errors is BOOL_SPELLINGS[raw.strip().lower()]


@pytest.mark.parametrize("env, match", [
    ({"EMBER_INSTRUCTION_LIMIT": "0"}, r"EMBER_INSTRUCTION_LIMIT='0': instruction_limit must be >= 1"),
    ({"EMBER_INSTRUCTION_LIMIT": "-10"}, r"EMBER_INSTRUCTION_LIMIT='-10': instruction_limit must be >= 1"),
    ({"EMBER_RECOMPILE_LIMIT": "0"}, r"EMBER_RECOMPILE_LIMIT='0': recompile_limit must be >= 1"),
    ({"EMBER_INLINE_DEPTH_LIMIT": "-1"}, r"EMBER_INLINE_DEPTH_LIMIT='-1'"),
    ({"EMBER_COMPILE_THREADS": "-2"}, r"EMBER_COMPILE_THREADS='-2': compile_threads must be >= 0"),
    ({"EMBER_RECOMPILE_LIMIT": "lots"}, r"EMBER_RECOMPILE_LIMIT='lots' is not an integer"),
    ({"EMBER_RECOMPILE_LIMIT": "8.5"}, r"EMBER_RECOMPILE_LIMIT='8.5' is not an integer"),
    ({"EMBER_COMPILE_THREADS": ""}, r"EMBER_COMPILE_THREADS='' is not an integer"),
    ({"EMBER_CACHE_DIR": ""}, r"EMBER_CACHE_DIR='': cache_dir must not be empty.*unset EMBER_CACHE_DIR"),
    ({"EMBER_LOGS": "graph_brakes"}, r"EMBER_LOGS='graph_brakes': logs names unknown log artifact"),
])
def test_bad_environment_values_name_the_variable(env, match):
    with pytest.raises(ValueError, match=match):
        Config.from_env(env)


def test_good_environment_values_are_parsed():
    got = Config.from_env({"EMBER_RECOMPILE_LIMIT": " 3 ", "EMBER_SUPPRESS_ERRORS": "1", "EMBER_LOGS": "all",
                           "EMBER_CACHE_DIR": "/tmp/c", "EMBER_COMPILE_THREADS": "0", "UNRELATED": "x"})
    assert (got.recompile_limit, got.suppress_errors, got.logs, got.cache_dir, got.compile_threads) == \
        (3, True, "all", "/tmp/c", 0)


def test_a_bad_variable_stops_import_ember_naming_it():
    env = {**os.environ, "EMBER_VERIFY": "maybe"}
    out = subprocess.run([sys.executable, "-c", "import ember"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode != 0
    assert "ValueError: EMBER_VERIFY='maybe' is not a boolean; accepted" in out.stderr


# ---- ember.compile arguments ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(options="max-autotune"), TypeError, r"options takes a dict .* 'max-autotune', which is a mode: "
                                              r"pass mode='max-autotune' instead"),
    (dict(options="fast"), TypeError, r"options must be a dict of backend options .*got str 'fast'"),
    (dict(options=[("x", 1)]), TypeError, r"options must be a dict .*got list"),
    (dict(fullgraph="yes"), TypeError, r"fullgraph must be True or False, got str 'yes'"),
    (dict(fullgraph=1), TypeError, r"fullgraph must be True or False, got int 1"),
    (dict(fullgraph=None), TypeError, r"fullgraph must be True or False, got NoneType"),
    (dict(dynamic="yes"), TypeError, r"dynamic must be None, True or False, got str 'yes'"),
    (dict(dynamic=0), TypeError, r"dynamic must be None, True or False, got int 0"),
    (dict(disable="no"), TypeError, r"disable must be True or False, got str 'no'"),
    (dict(mode="max_autotune"), ValueError, r"unknown mode 'max_autotune'; did you mean 'max-autotune'\?; "
                                            r"valid modes: None, 'default'"),
    (dict(mode=3), ValueError, r"unknown mode 3; valid modes"),
    (dict(backend="eagr"), ValueError, r"unknown ember backend 'eagr'; available: .*\. Did you mean 'eager'\?"),
    (dict(backend=3), TypeError, r"backend must be a name or a callable, not int"),
    # inductor option names are the ember backend's options (docs/dropin.md); a typo of one is not
    (dict(options={"max_autotun": True}), ValueError, r"unknown option 'max_autotun' for backend 'ember' \(did you mean 'max_autotune'\?\)"),
    (dict(mode="max-autotune", options={}), RuntimeError, r"Either mode or options"),
])
def test_bad_compile_arguments_are_rejected_at_the_call(kwargs, error, match):
    with pytest.raises(error, match=match):
        ember.compile(f, **kwargs)
    if "backend" not in kwargs and "unknown option" not in match:  # checked once there is a backend
        with pytest.raises(error, match=match):  # the decorator form fails where it is written
            ember.compile(**kwargs)


def test_disable_true_still_checks_the_other_arguments():
    with pytest.raises(TypeError, match="dynamic must be None, True or False"):
        ember.compile(f, disable=True, dynamic="yes")


def test_an_unknown_option_key_suggests_the_declared_one(monkeypatch):
    from ember.backends import registry
    spec = registry.BackendSpec("errcfg_opts", lambda gm, example_inputs, options=None: gm.forward,
                                options={"device": registry.OptionSpec(str, "CPU")})
    monkeypatch.setitem(registry._BACKENDS, "errcfg_opts", spec)
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'devic' for backend 'errcfg_opts' "
                                         r"\(did you mean 'device'\?\); valid options: device "):
        ember.compile(f, backend="errcfg_opts", options={"devic": "GPU"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'zz', 1 for backend 'errcfg_opts'; valid"):
        ember.compile(f, backend="errcfg_opts", options={1: "x", "zz": 2})  # keys of mixed types
