"""One typed options object for ember, readable from ``EMBER_*`` environment variables.

Every field documents itself; ``ENV_TABLE`` (derived from the fields) is the table the docs show.
Deep code receives the values it needs; it does not read environment variables itself.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field


def _env_name(name: str) -> str:
    return "EMBER_" + name.upper()


@dataclass
class Config:
    recompile_limit: int = field(default=8, metadata={"doc": "cache entries per compiled function before further misses run eagerly"})
    inline_depth_limit: int = field(default=48, metadata={"doc": "deepest chain of inlined user calls before tracing gives up"})
    instruction_limit: int = field(default=2_000_000, metadata={"doc": "bytecode instructions one trace may interpret (guards against endless loops)"})
    logs: str = field(default="", metadata={"doc": "comma list of log artifacts: graph_breaks, recompiles, guards, graph_code, output_code, aot_graphs, openvino, bytecode (or all)"})
    verify: bool = field(default=False, metadata={"doc": "run torch.fx Graph.lint() on every captured graph"})
    native_force_triton: bool = field(default=False, metadata={"doc": "run the native backend's Triton kernels on CPU tensors too (needs TRITON_INTERPRET=1 before triton is imported; for tests)"})
    emulate_precision_casts: bool = field(default=False, metadata={"doc": "native backend: round fp16/bf16 casts inside fused kernels as eager rounds each op's result (off: computed in fp32 until stored, like torch.compile; closer to exact, faster)"})
    compile_threads: int = field(default=0, metadata={"doc": "native backend: Triton kernel builds at once, in worker processes, before a graph's first call (0: one per CPU core, up to 16; 1: no workers, each kernel built at its first launch)"})
    aot_cache: bool = field(default=True, metadata={"doc": "keep traced forward/backward graphs on disk (under cache_dir), so a later process skips analysis and tracing"})
    cache_dir: str = field(default=os.path.join(os.path.expanduser("~"), ".cache", "ember"), metadata={"doc": "on-disk cache for compiled artifacts"})

    @classmethod
    def from_env(cls) -> "Config":
        kwargs = {}
        for f in dataclasses.fields(cls):
            raw = os.environ.get(_env_name(f.name))
            if raw is None:
                continue
            kind = type(f.default)
            if kind is bool:
                kwargs[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif kind is int:
                try:
                    kwargs[f.name] = int(raw)
                except ValueError:
                    raise ValueError(f"{_env_name(f.name)}={raw!r} is not an integer") from None
            else:
                kwargs[f.name] = raw
        return cls(**kwargs)


ENV_TABLE = [(_env_name(f.name), f.name, f.default, f.metadata.get("doc", "")) for f in dataclasses.fields(Config)]



def markdown_table() -> str:
    """The table docs/config.md shows (a test keeps the two identical)."""
    rows = ["| Variable | Field | Default | Meaning |", "|---|---|---|---|"]
    for env, name, default, doc in ENV_TABLE:
        shown = "~/.cache/ember" if name == "cache_dir" else repr(default)
        rows.append(f"| `{env}` | `{name}` | `{shown}` | {doc} |")
    return "\n".join(rows) + "\n"


config = Config.from_env()
