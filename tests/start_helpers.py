"""Helpers for tests of a ``serve --stdio`` start: a store with its start table, and a line client.

:class:`LineClient` runs the real CLI over real pipes and reads its answers with a deadline (a
thread reads stdout into a queue), so a test waits on a condition, never a sleep.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from replay_helpers import build_store

from replay_sim.replay.stdio.start.write import write_start_table
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.tooleffects import keep_effects
from replay_sim.store import Store

ANSWER_WAIT = 60.0  # seconds an answer is waited for (the replay's first load included)

INITIALIZE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
INITIALIZED: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def indexed(store: Store, index_dir: Path, embedder: SentenceTransformerEmbedder) -> None:
    """Index the store and write its start table, as ``replay-sim index build`` does (closes it)."""
    build_index(store, embedder=embedder, directory=index_dir)
    keep_effects(store)
    path = store.path
    store.close()
    write_start_table(path, index_dir)


def demo_with_table(folder: Path, embedder: SentenceTransformerEmbedder) -> tuple[Path, Path]:
    """The shared demo store in ``folder``, indexed, with its start table: ``(db, index_dir)``."""
    db, index_dir = folder / "r.db", folder / "index"
    indexed(build_store(db), index_dir, embedder)
    return db, index_dir


def call(id_: Any, name: str, **arguments: Any) -> dict[str, Any]:
    """A ``tools/call`` request."""
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


class LineClient:
    """``replay-sim serve --stdio --server SERVER`` over real pipes, one JSON-RPC message per line.

    Args:
        db: The store.
        index_dir: Its index folder (where the start table is looked for).
        server: The recorded server served.
    """

    def __init__(self, db: Path, index_dir: Path, server: str = "demo") -> None:
        command = [sys.executable, "-m", "replay_sim", "serve", "--stdio", "--server", server]
        command += ["--db", str(db), "--index-dir", str(index_dir)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self._answers: queue.Queue[bytes] = queue.Queue()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._answers.put(line)
        self._answers.put(b"")

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        """What the process wrote on stderr so far."""
        return b"".join(self._stderr).decode(errors="replace")

    def send(self, *lines: dict[str, Any] | bytes) -> None:
        """Write messages (dicts as JSON) or raw lines, each with its newline."""
        assert self.process.stdin is not None
        for line in lines:
            data = line if isinstance(line, bytes) else json.dumps(line).encode()
            self.process.stdin.write(data + b"\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        """The next answer line, parsed (fails the test past :data:`ANSWER_WAIT`, or at EOF)."""
        try:
            line = self._answers.get(timeout=ANSWER_WAIT)
        except queue.Empty:
            raise AssertionError(
                f"no answer within {ANSWER_WAIT:g} s; stderr: {self.stderr[-3000:]}"
            ) from None
        assert line, f"the process ended; stderr: {self.stderr[-3000:]}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def until(self, id_: Any) -> list[dict[str, Any]]:
        """Every answer up to and including the one with id ``id_``."""
        answers = [self.receive()]
        while answers[-1].get("id") != id_:
            answers.append(self.receive())
        return answers

    def handshake(self) -> dict[str, Any]:
        """``initialize`` (id 1) and ``notifications/initialized``; the answer to ``initialize``."""
        self.send(INITIALIZE, INITIALIZED)
        return self.receive()

    def stop(self) -> None:
        """Kill the process if it still runs (the end of a test, whatever its outcome)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def close(self) -> int:
        """Close stdin and wait for the process to exit; its exit status."""
        assert self.process.stdin is not None
        if not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            return self.process.wait(timeout=ANSWER_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
