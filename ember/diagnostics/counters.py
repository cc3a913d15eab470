"""ember's event counters, as ``torch._dynamo.utils.counters``: counts a test or a user reads to see
what happened without parsing logs. ``ember.reset()`` leaves them alone; clear them yourself.

- ``backend_failures``: graphs whose backend raised while compiling them (each failure once)
- ``backend_failures_suppressed``: of those, the ones run eagerly under ``config.suppress_errors``
"""
from __future__ import annotations

import collections

COUNTERS: collections.Counter = collections.Counter()
