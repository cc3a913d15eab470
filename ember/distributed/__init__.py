"""Distributed training support: the DDP bucketing pass (``buckets.py``).

How ``ember.compile`` meets ``DistributedDataParallel`` (the same split torch.compile makes):

- ``ember.compile(DDP(model))``: DDP's forward (the reducer's bookkeeping, buffer broadcasts) runs as
  plain Python and the module it wraps is compiled on its own (``frontend/trace_rules.WRAPPER_MODULES``,
  ``frontend/cache.WrapperModuleCache``);
- ``DDP(ember.compile(model))``: DDP calls the compiled module as it would any module;
- either way, a graph compiled while a DDP forward is running is split at DDP's gradient-bucket
  boundaries (``buckets.py``, on unless ``ember.config.optimize_ddp`` is off), each part compiled by the
  backend on its own, so the gradients of a bucket are ready, and its all-reduce starts, while the
  backward of the earlier parts still runs;
- a graph of repeated blocks (a transformer's layers) is split at its blocks instead (the regional
  pass, ``backends/regional.py``, ``config.regional_ddp``): each block's backward is a node of its
  own, so the buckets fire as blocks finish, and identical blocks share one compile.

Under any process group, each compile is compared with the other ranks' (``divergence.py``,
``ember.config.distributed_check``): a rank that compiled differently is reported, not left to hang.
"""
from ember.distributed.buckets import active_ddp_module, plan_buckets, split_at_buckets, with_ddp_buckets

__all__ = ["active_ddp_module", "plan_buckets", "split_at_buckets", "with_ddp_buckets"]
