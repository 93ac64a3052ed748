"""How far a long CLI step is: a bar on a terminal, a line every few seconds otherwise (stderr).

A step that takes more than a couple of seconds says how far it is, so a user (or a CI log) can
tell a slow step from a stuck one. tqdm draws the bar on a terminal; elsewhere — a log file, CI —
tqdm draws nothing and :class:`Progress` writes ``DESC: DONE/TOTAL UNIT`` lines instead: the first
once the step has run :data:`LINE_EVERY_S` seconds (``REPLAY_SIM_PROGRESS_S`` sets another
period), then at most one a period, and a last one when the step ends — a step shorter than that
says nothing.
"""

from __future__ import annotations

import os
import time
from types import TracebackType
from typing import Self

import click
from tqdm import tqdm

__all__ = ["LINE_EVERY_S", "PERIOD_ENV", "Progress"]

LINE_EVERY_S = 2.0
"""Seconds between two progress lines when not on a terminal (and before the first)."""
PERIOD_ENV = "REPLAY_SIM_PROGRESS_S"
"""Environment variable: another number of seconds for :data:`LINE_EVERY_S`."""


class Progress:
    """A progress callback ``(done, total)`` for a library function, shown as a bar or as lines.

    Args:
        desc: What the step is doing (``importing``, ``exploring`` …).
        unit: What is counted (``call``, ``B`` …); ``B`` is shown in kB/MB.
    """

    def __init__(self, desc: str, unit: str) -> None:
        self.desc = desc
        self.unit = unit
        scaled = unit == "B"
        self.bar = tqdm(total=0, unit=unit, desc=desc, disable=None, unit_scale=scaled, unit_divisor=1024)
        self.period = float(os.environ.get(PERIOD_ENV) or LINE_EVERY_S)
        self._said = time.monotonic()
        self._spoke = False
        self._last: tuple[int, int] | None = None

    def __call__(self, done: int, total: int) -> None:
        """Say that ``done`` of ``total`` are done."""
        self._last = (done, total)
        if self.bar.disable:
            now = time.monotonic()
            if now - self._said >= self.period:
                self._said, self._spoke = now, True
                self._line(done, total)
            return
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def _line(self, done: int, total: int) -> None:
        if self.unit == "B":
            click.echo(f"{self.desc}: {done / 1e6:.1f}/{total / 1e6:.1f} MB", err=True)
        else:
            click.echo(f"{self.desc}: {done}/{total} {self.unit}s", err=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.bar.disable and kind is None and self._last is not None and self._spoke:
            self._line(*self._last)  # where it ended, when a line was said before
        self.bar.close()
