"""A one-line progress bar on stderr, redrawn in place with ``\\r``."""

from __future__ import annotations

import time
from typing import TextIO

from arrowlake.units import human_size

BAR_WIDTH = 30
#: Redraw at most this often; a redraw per record batch would flood a slow terminal.
REDRAW_SECONDS = 0.1


class ProgressBar:
    """``label [#####.....]  45%  1.2/2.7 MiB`` on ``stream`` while work is done.

    A disabled bar does nothing, so callers update it unconditionally. Use it as a context
    manager: leaving the block ends the line so later messages start on a fresh one.
    """

    def __init__(self, stream: TextIO, total: int | None, *, label: str = "",
                 unit: str = "bytes", enabled: bool = True) -> None:
        self.stream = stream
        self.total = total
        self.label = label
        self.unit = unit
        self.enabled = enabled
        self.done = 0
        self._drawn_at = 0.0
        self._width = 0

    def __enter__(self) -> ProgressBar:
        self._draw(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: int) -> None:
        self.done += n
        self._draw()

    def set(self, done: int) -> None:
        self.done = done
        self._draw()

    def close(self) -> None:
        if self.enabled and self._width:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    def _amount(self, n: float) -> str:
        return human_size(n) if self.unit == "bytes" else f"{int(n):,} {self.unit}"

    def render(self) -> str:
        label = f"{self.label} " if self.label else ""
        if not self.total:
            return f"{label}{self._amount(self.done)}"
        fraction = min(1.0, self.done / self.total)
        filled = int(fraction * BAR_WIDTH)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        if self.unit == "bytes":
            amount = f"{human_size(self.done)} / {human_size(self.total)}"
        else:
            amount = f"{self.done:,} / {self.total:,} {self.unit}"
        return f"{label}[{bar}] {fraction:4.0%}  {amount}"

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < REDRAW_SECONDS:
            return
        self._drawn_at = now
        text = self.render()
        # Pad with spaces so a shorter line fully covers the previous one.
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = max(self._width, len(text))
