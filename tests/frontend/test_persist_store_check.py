"""The frontend cache's store-time check (session 38: it resolves a record's classes and callables
without building its graph values): a record that could not load is not stored; one that can is
stored and loads back with its values as FakeTensors and its callables found again."""
import collections

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import ember
from ember.frontend import persist


def _record(inputs):
    return dict(version=persist._VERSION, name="__ember_entry_t", source="def __ember_entry_t(x):\n    return x\n",
                guards_source="def __ember_entry_t(x):\n    return None\n", ns={}, funcs=[], inputs=inputs, graph=None,
                op_count=0, params=[], has_graph=False)


def test_a_record_that_cannot_load_is_not_stored(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    before = persist.STATS["uncacheable"]
    key = "ab" * 32
    persist.store(key, _record([collections.Counter(a=1)]))  # (a class outside the allow-list)
    assert persist.STATS["uncacheable"] == before + 1
    assert not persist._read_blobs(key, quiet=True)


def test_a_stored_record_loads_its_values_and_callables(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    with FakeTensorMode():
        v = torch.empty(2, 3)
    key = "cd" * 32
    persist.store(key, _record([v, torch.ops.aten.add.Tensor, torch.sin]))
    blobs = persist._read_blobs(key)
    assert blobs
    rec = persist._record(key, blobs[0])
    got, op, fn = rec["inputs"]
    assert isinstance(got, FakeTensor) and got.shape == (2, 3)
    assert op is torch.ops.aten.add.Tensor and fn is torch.sin
