"""Bounded capture of command and file output.

A tool result goes back to a model with a limited context, and a runaway command
can print gigabytes, so output is cut to a head and a tail while it is read,
never after it has all been held in memory.
"""

from __future__ import annotations

BYTES_PER_CHAR = 4


def truncation_marker(detail: str) -> str:
    return f"\n[... {detail} ...]\n"


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the head and the tail of `text` so that the result fits in `max_chars`."""
    if len(text) <= max_chars:
        return text, False
    marker = truncation_marker(f"output cut, {len(text)} characters in all")
    return _join_head_tail(text, text, marker, max_chars), True


def _join_head_tail(head: str, tail: str, marker: str, max_chars: int) -> str:
    budget = max(max_chars - len(marker), 0)
    head_chars = budget // 2
    tail_chars = budget - head_chars
    return head[:head_chars] + marker + (tail[-tail_chars:] if tail_chars else "")


class BoundedOutput:
    """Accumulates a byte stream keeping at most a head and a tail of it."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._limit_bytes = max(max_chars, 1) * BYTES_PER_CHAR
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0

    @property
    def held_bytes(self) -> int:
        return len(self._head) + len(self._tail)

    def feed(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = self._limit_bytes - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            excess = len(self._tail) - self._limit_bytes
            if excess > 0:
                del self._tail[:excess]

    def skip(self, count: int) -> None:
        """Count bytes that were never read, e.g. the middle of a large file."""
        self.total_bytes += count

    def text(self) -> tuple[str, bool]:
        """The captured text and whether anything was cut."""
        if self.total_bytes == self.held_bytes:
            return cap_text(bytes(self._head + self._tail).decode("utf-8", errors="replace"), self.max_chars)
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        marker = truncation_marker(f"output cut, {self.total_bytes} bytes in all")
        return _join_head_tail(head, tail, marker, self.max_chars), True
