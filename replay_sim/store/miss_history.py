"""The histories kept misses were missed after, each step kept once: a miss log grows linearly.

A kept miss needs the state-changing calls its episode made before it (:mod:`replay_sim.store.misses`).
Written out in every miss, an episode that diverged from every recording wrote its whole history
again with each miss — 300 misses of 1 KB arguments wrote 55 MB. Here histories form a tree in
the ``miss_steps`` table: a node is a history, its ``parent`` the history one step shorter (0 the
initial state), holding that last step's key, method and params. A miss refers to its node
(``prefix`` holds ``{"history": id, "steps": n}``), so each new step of an episode costs one row,
however long the episode. Misses kept by older code hold their steps inline (a JSON list) and are
read as before.

The log's size is bounded in bytes too (:data:`DEFAULT_MAX_MISS_BYTES`, ``MissLog(max_bytes=…)``):
past it the least recently missed calls are evicted, oldest first, with the history steps no kept
miss needs any more.
"""

from __future__ import annotations

import json
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from replay_sim.store.store import Store

__all__ = ["DEFAULT_MAX_MISS_BYTES", "MissHistories", "log_size", "read_prefix"]

DEFAULT_MAX_MISS_BYTES = 256 * 1024 * 1024
"""Bytes a miss log keeps at most (its misses' params, histories, candidates and reasons)."""
_MEMO = 65_536  # (parent, key) -> node entries remembered
_ROW_BYTES = "length(params) + COALESCE(length(prefix), 0) + COALESCE(length(candidates), 0) + length(reason)"
_STEP_BYTES = "length(key) + COALESCE(length(params), 0)"


def log_size(conn: sqlite3.Connection) -> tuple[int, int]:
    """``(rows, bytes)`` of the miss log on ``conn``: its misses, and bytes of them and their histories."""
    rows, row_bytes = conn.execute(f"SELECT COUNT(*), COALESCE(SUM({_ROW_BYTES}), 0) FROM misses").fetchone()
    (step_bytes,) = conn.execute(f"SELECT COALESCE(SUM({_STEP_BYTES}), 0) FROM miss_steps").fetchone()
    return int(rows), int(row_bytes) + int(step_bytes)


class MissHistories:
    """Writes the histories of misses into one store's ``miss_steps`` tree, remembering recent nodes.

    Used by one writer (the miss log's thread), inside its transactions: :meth:`node` finds or adds
    a history, :meth:`committed` keeps what the transaction added once it is durable.

    Args:
        step: The key, method and params of one state-changing call by key (``{"key"}`` alone when
            its params cannot be found).
    """

    def __init__(self, step: Callable[[str], dict[str, Any]]) -> None:
        self.step = step
        self._nodes: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._added: dict[tuple[int, str], int] = {}  # by the transaction under way
        self.added_bytes = 0
        """Bytes of the steps added by the transaction under way."""

    def node(self, conn: sqlite3.Connection, prefix: Sequence[str]) -> int:
        """The node of the history ``prefix`` (keys, oldest first), added step by step as needed."""
        node = 0
        for key in prefix:
            child = self._nodes.get((node, key)) or self._added.get((node, key))
            if child is None:
                found = conn.execute(
                    "SELECT id FROM miss_steps WHERE parent=? AND key=?", (node, key)
                ).fetchone()
                if found is not None:
                    child = int(found[0])
                else:
                    step = self.step(key)
                    params = json.dumps(step["params"], ensure_ascii=False) if "params" in step else None
                    cursor = conn.execute(
                        "INSERT INTO miss_steps (parent, key, method, params) VALUES (?, ?, ?, ?)",
                        (node, key, step.get("method"), params),
                    )
                    child = int(cursor.lastrowid or 0)
                    self.added_bytes += len(key) + len(params or "")
                self._added[(node, key)] = child
            node = child
        return node

    def committed(self, durable: bool) -> None:
        """Remember the nodes the transaction added once it committed (``durable``); forget them if not."""
        if durable:
            for entry, node in self._added.items():
                self._nodes[entry] = node
                self._nodes.move_to_end(entry)
            while len(self._nodes) > _MEMO:
                self._nodes.popitem(last=False)
        self._added.clear()
        self.added_bytes = 0

    def evict(self, conn: sqlite3.Connection, max_rows: int, max_bytes: int) -> tuple[int, int, int]:
        """Evict the least recently missed calls until within ``max_rows`` and 90 % of ``max_bytes``.

        Returns:
            ``(misses evicted, rows left, bytes left)``.
        """
        evicted = 0
        rows, size = log_size(conn)
        while rows and (rows > max_rows or size > max_bytes * 0.9):
            cut = max(1, rows // 10, rows - max_rows)
            conn.execute(
                "DELETE FROM misses WHERE id IN (SELECT id FROM misses ORDER BY last_at, id LIMIT ?)", (cut,)
            )
            evicted += cut
            conn.execute(
                "WITH RECURSIVE live(id) AS ("
                " SELECT json_extract(prefix, '$.history') FROM misses WHERE prefix LIKE '{%'"
                " UNION SELECT s.parent FROM miss_steps s JOIN live ON s.id = live.id WHERE s.parent != 0)"
                " DELETE FROM miss_steps WHERE id NOT IN (SELECT id FROM live WHERE id IS NOT NULL)"
            )
            rows, size = log_size(conn)
        self._nodes.clear()  # evicted nodes' ids must not be reused from memory
        self._added.clear()
        return evicted, rows, size


def read_prefix(
    store: Store, text: str | None, cache: dict[int, list[dict[str, Any]]]
) -> list[dict[str, Any]] | None:
    """A kept miss's history, oldest first, from its ``prefix`` column (inline, or a node of the tree).

    Args:
        store: The store holding the miss.
        text: The ``prefix`` column: None (no history), a JSON list of steps, or a node reference.
        cache: Histories read already, by node (shared by the misses of one read).
    """
    if text is None:
        return None
    value = json.loads(text)
    if isinstance(value, list):
        return value
    node = int(value["history"])
    if node not in cache:
        chain = store._query(
            "WITH RECURSIVE chain(id, parent, key, method, params, depth) AS ("
            " SELECT id, parent, key, method, params, 0 FROM miss_steps WHERE id=?"
            " UNION ALL SELECT s.id, s.parent, s.key, s.method, s.params, c.depth + 1"
            " FROM miss_steps s JOIN chain c ON s.id = c.parent)"
            " SELECT key, method, params FROM chain ORDER BY depth DESC",
            (node,),
        )
        cache[node] = [
            {"key": key} if params is None else {"key": key, "method": method, "params": json.loads(params)}
            for key, method, params in chain
        ]
    return list(cache[node])
