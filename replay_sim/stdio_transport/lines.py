"""Framing a byte stream into lines, in linear time, with a cap on a line's length."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LineSplitter", "TooLong"]

_HEAD = 256  # bytes of a dropped line kept to find its request id


@dataclass(frozen=True, slots=True)
class TooLong:
    """A line longer than the cap, dropped: its length and its first bytes."""

    size: int
    head: bytes


class LineSplitter:
    """Splits a byte stream into lines in linear time; lines over ``max_line`` bytes are dropped.

    Each byte is scanned once (only the new chunk is searched for a newline) and copied at most
    once, so a long line costs time linear in its length; once a line passes the cap, its bytes
    are counted and discarded, so it costs no memory either.

    Args:
        max_line: The longest line kept, in bytes (without its newline).
    """

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._dropped: int | None = None  # bytes of the line being dropped, None when keeping
        self._head = b""

    @property
    def dropping(self) -> bool:
        """Whether the line being read has passed the cap (its end not read yet)."""
        return self._dropped is not None

    def feed(self, chunk: bytes) -> list[bytes | TooLong]:
        """The lines (or dropped lines) that ``chunk`` completes, in order."""
        if not self._buffer and self._dropped is None and chunk[-1:] == b"\n" and len(chunk) <= self.max_line:
            return list(chunk[:-1].split(b"\n"))  # whole lines only, none too long: the usual read
        done: list[bytes | TooLong] = []
        view = memoryview(chunk)
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = view[start:] if end < 0 else view[start:end]
            if self._dropped is not None:
                self._dropped += len(piece)
                if len(self._head) < _HEAD:
                    self._head += bytes(piece[: _HEAD - len(self._head)])
            elif len(self._buffer) + len(piece) > self.max_line:
                self._head = bytes(self._buffer[:_HEAD]) + bytes(piece[: max(0, _HEAD - len(self._buffer))])
                self._dropped = len(self._buffer) + len(piece)
                self._buffer = bytearray()
            else:
                self._buffer += piece
            if end < 0:
                return done
            if self._dropped is not None:
                done.append(TooLong(self._dropped, self._head))
                self._dropped, self._head = None, b""
            else:
                done.append(bytes(self._buffer))
                self._buffer.clear()
            start = end + 1
