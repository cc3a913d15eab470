"""A one-line progress bar on stderr (on a terminal), or one line per step (in a log or a pipe)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, enabled: bool = True, stream=None, width: int = 24):
        self.total, self.done, self.width = max(1, total), 0, width
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.text = ""

    def label(self, text: str) -> None:
        """Say what runs now (a compile can take a while: the bar shows which one)."""
        self.text = text
        if self.tty:
            self._draw()

    def advance(self, n: int = 1, text: str | None = None) -> None:
        self.done = min(self.total, self.done + n)
        if text is not None:
            self.text = text
        if self.tty:
            self._draw()
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {self.text}", file=self.stream, flush=True)

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:5.0f}s {self.text}"
        self.stream.write("\r" + line[:120].ljust(120))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()
