"""A TorchServe handler that compiles the model with ember.

TorchServe 0.12 compiles a model itself when the model config has a ``pt2`` section, but only through
``torch.compile`` and only for backend names in its own fixed list: ``backend: ember`` there is logged
as unsupported and the model is served uncompiled. This handler therefore loads the model with
BaseHandler (no ``pt2`` section), then compiles it with ``ember.compile`` according to the config's
``ember_handler`` section:

    ember_handler:
      backend: ember        # any ember backend ("ember", "openvino", ...), or "none" to serve eagerly
      mode: null            # the backend's mode (ember.compile's mode=)
      options: {}           # the backend's options (ember.compile's options=)
      dynamic: null         # ember.compile's dynamic=
      warmup_batches: [1, 2, 16]  # batch sizes run once at startup: the compiles happen before serving
      torch_threads: 0      # torch.set_num_threads in the worker (0: leave torch's default)

TorchServe may hand the handler several requests at once (``batchSize`` in the config): the valid ones
run as one batch, each invalid one gets HTTP 400 with a message, the others their answers. Every
answer carries ``ember``: the backend, how many graphs were compiled, how many calls of compiled graphs
ran so far, and ember's eager-fallback count, so a client can check that compiled code served it.
The same numbers go into the ``X-Ember-Graph-Calls`` and ``X-Ember-Graphs`` response headers.
"""
from __future__ import annotations

import json
import logging
import time

import numpy as np
import torch
from ts.torch_handler.base_handler import BaseHandler

import serving_protocol as proto

logger = logging.getLogger(__name__)


class EmberHandler(BaseHandler):
    def initialize(self, context):
        config = dict((getattr(context, "model_yaml_config", None) or {}).get("ember_handler") or {})
        if "pt2" in (getattr(context, "model_yaml_config", None) or {}):
            raise RuntimeError("model config: remove the pt2 section; EmberHandler compiles the model itself "
                               "(set ember_handler.backend instead)")
        threads = int(config.get("torch_threads") or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        super().initialize(context)  # loads model.py + the state_dict, eval mode, on self.device
        self.backend_name = str(config.get("backend", "ember"))
        self.counter = None
        self.compiled = self.model
        if self.backend_name != "none":
            import ember
            from ember.testing import CompileCounterWithBackend

            self.counter = CompileCounterWithBackend(self.backend_name, mode=config.get("mode"),
                                                     options=config.get("options") or None)
            self.compiled = ember.compile(self.model, backend=self.counter, dynamic=config.get("dynamic"))
            logger.info("ember %s from %s compiles the model with backend %r", ember.__version__, ember.__file__,
                        self.backend_name)
        self._fallbacks_at_start = self._fallbacks()
        start = time.perf_counter()
        with torch.inference_mode():
            for n in config.get("warmup_batches", [1, 2, 16]):
                self.compiled(torch.zeros(int(n), *proto.SAMPLE_SHAPE, device=self.device))
        logger.info("warm-up (compiles) took %.2f s; %s", time.perf_counter() - start, json.dumps(self.stats()))
        self.initialized = True

    @staticmethod
    def _fallbacks() -> int:
        try:
            from ember.diagnostics import counters
        except ImportError:
            return 0
        return counters.fallbacks()

    @staticmethod
    def _renderers() -> dict:
        """How the native backend ran each graph it compiled: {"cpp"|"triton"|"aten": graphs}."""
        try:
            from ember.diagnostics import counters
        except ImportError:
            return {}
        return {k.split(".", 1)[1]: v for k, v in counters.compiled_snapshot().items() if k.startswith("native_graphs.")}

    def stats(self) -> dict:
        """What proves the answer came from compiled code (see the module docstring)."""
        c = self.counter
        return {"backend": self.backend_name,
                "graphs": c.frame_count if c else 0,
                "graph_calls": c.call_count if c else 0,
                "renderers": self._renderers(),
                "eager_fallbacks": self._fallbacks() - self._fallbacks_at_start}

    def handle(self, data, context):
        self.context = context
        arrays, errors = [], {}
        for i, request in enumerate(data):
            body = request.get("body") if request.get("body") is not None else request.get("data")
            try:
                arrays.append((i, proto.decode(body)))
            except proto.BadRequest as exc:
                errors[i] = str(exc)
        outputs = {}
        if arrays:
            batch = torch.from_numpy(np.concatenate([a for _, a in arrays])).to(self.device)
            with torch.inference_mode():
                logits = self.compiled(batch).float().cpu().numpy()
            start = 0
            for i, a in arrays:
                outputs[i] = logits[start:start + len(a)]
                start += len(a)
        stats = self.stats()
        replies = []
        for i in range(len(data)):
            if i in errors:
                context.set_response_status(400, "Bad Request", idx=i)
                replies.append(json.dumps({"error": errors[i]}))
                continue
            context.set_response_header(i, "X-Ember-Graph-Calls", str(stats["graph_calls"]))
            context.set_response_header(i, "X-Ember-Graphs", str(stats["graphs"]))
            replies.append(json.dumps({"logits": outputs[i].tolist(), "ember": stats}))
        return replies
