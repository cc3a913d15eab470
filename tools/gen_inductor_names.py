"""Write ember/backends/inductor_names.txt: every option name torch.compile(options=...) accepts for
the inductor backend in the installed torch (the keys of torch._inductor.config), one per line.

A dev tool (it imports torch._inductor, which ember itself never does): rerun it when moving to a
new torch release; tests/test_inductor_options.py checks the file against the installed torch.

    python tools/gen_inductor_names.py
"""
from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "ember" / "backends" / "inductor_names.txt"


def current_names() -> list[str]:
    import torch
    import torch._inductor.config as inductor_config  # the peer, in a dev tool only

    del torch
    return sorted(n for n in inductor_config._config if n != "TYPE_CHECKING")


def main() -> None:
    import torch

    names = current_names()
    OUT.write_text(f"# torch.compile inductor option names of torch {torch.__version__.split('+')[0]} "
                   "(tools/gen_inductor_names.py)\n" + "\n".join(names) + "\n")
    print(f"wrote {len(names)} names to {OUT}")


if __name__ == "__main__":
    main()
