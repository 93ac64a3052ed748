"""Store helpers importable by name, so a spawned writer process can run them too."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from replay_sim.store import Store


def echo_call(store: Store, n: int, session: str | None = None) -> int:
    """Record one ``echo`` call numbered ``n``; returns its id."""
    return store.record_call(
        "echo",
        "tools/call",
        {"name": "echo", "arguments": {"n": n}},
        result={"content": [{"type": "text", "text": str(n)}]},
        session=session,
        latency_ms=1.5,
    )


def write_from_process(path: str, session: str) -> None:
    """Record 40 calls into the store at ``path`` (the body of one writer process)."""
    with Store(path) as store:
        for n in range(40):
            echo_call(store, n, session)


@contextmanager
def write_locked(path: str | Path) -> Iterator[None]:
    """Another connection holds the store's write lock (``BEGIN IMMEDIATE``) while the block runs."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()
