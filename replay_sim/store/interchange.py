"""JSONL interchange: ``replay-sim import`` and ``export`` (the format is a contract, see DESIGN.md).

One object per line, ``type`` first: ``server``, ``listing`` and ``call`` lines. Export writes
servers, then listings, then calls in recorded order, with a fixed key order, so that
export → import → export is byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from replay_sim.errors import InterchangeError
from replay_sim.protocol import LISTING_METHODS
from replay_sim.store import Origin, ServerRecord, Store

__all__ = ["export_jsonl", "import_jsonl", "merge"]


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def export_lines(store: Store) -> Iterator[str]:
    """Yield the store's content as JSONL lines (each ending in a newline)."""
    for server in store.servers():
        line: dict[str, Any] = {
            "type": "server",
            "server": server.name,
            "info": server.info,
            "capabilities": server.capabilities,
            "protocol_version": server.protocol_version,
        }
        if server.instructions is not None:
            line["instructions"] = server.instructions
        yield _line(line)
    for server in store.servers():
        for method, result in store.listings(server.name).items():
            yield _line({"type": "listing", "server": server.name, "method": method, "result": result})
    after = 0
    while batch := store.recordings(after_id=after, limit=1000):
        for rec in batch:
            call: dict[str, Any] = {
                "type": "call",
                "server": rec.server,
                "method": rec.method,
                "params": rec.params,
                "result": rec.result,
                "error": rec.error,
                "session": rec.session,
                "seq": rec.seq,
                "latency_ms": rec.latency_ms,
                "recorded_at": rec.recorded_at,
                "origin": rec.origin,
            }
            if rec.notifications:
                call["notifications"] = rec.notifications
            yield _line(call)
        after = batch[-1].id


def export_jsonl(store: Store, out: IO[str]) -> int:
    """Write the whole store to ``out`` as JSONL.

    Args:
        store: The store to export.
        out: A text stream.

    Returns:
        The number of lines written.
    """
    count = 0
    for line in export_lines(store):
        out.write(line)
        count += 1
    return count


def _require(obj: dict[str, Any], field: str, where: str) -> Any:
    if field not in obj:
        raise InterchangeError(f"{where}: missing field {field!r}")
    return obj[field]


def import_jsonl(store: Store, path: str | Path, lines: Iterable[str] | None = None) -> dict[str, int]:
    """Read a JSONL file into the store; every line is validated before anything is written.

    Args:
        store: Destination store.
        path: The file (also used in error messages).
        lines: Already-open lines, instead of reading ``path``.

    Returns:
        Counts of imported ``server``, ``listing`` and ``call`` lines, and of ``duplicate`` calls
        skipped because the store holds them already (importing twice changes nothing).

    Raises:
        InterchangeError: A line is not JSON or lacks a required field (names file and line).
    """
    path = Path(path)
    if lines is None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InterchangeError(f"{path}: cannot read: {exc.strerror}") from exc
    parsed: list[tuple[str, dict[str, Any]]] = []
    for number, text in enumerate(lines, start=1):
        where = f"{path}:{number}"
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InterchangeError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise InterchangeError(f"{where}: expected a JSON object")
        kind = obj.get("type")
        _require(obj, "server", where)
        if kind == "server":
            _require(obj, "info", where)
        elif kind == "listing":
            if _require(obj, "method", where) not in LISTING_METHODS:
                raise InterchangeError(f"{where}: {obj['method']!r} is not a listing method")
            _require(obj, "result", where)
        elif kind == "call":
            _require(obj, "method", where)
            if not isinstance(obj.get("params", {}), dict):
                raise InterchangeError(f"{where}: params must be an object")
            if obj.get("result") is None and obj.get("error") is None:
                raise InterchangeError(f"{where}: a call needs a result or an error")
        else:
            raise InterchangeError(f"{where}: unknown line type {kind!r} (server, listing, call)")
        parsed.append((kind, obj))

    counts = {"server": 0, "listing": 0, "call": 0, "duplicate": 0}
    with store.transaction(f"import {path}"):
        _write(store, parsed, counts)
    return counts


def _write(store: Store, parsed: list[tuple[str, dict[str, Any]]], counts: dict[str, int]) -> None:
    sessions: set[str] = set()
    for kind, obj in parsed:
        if (
            kind == "call"
            and obj.get("recorded_at")
            and store.contains(
                obj["server"],
                obj["method"],
                obj.get("params") or {},
                obj.get("session"),
                obj.get("seq"),
                obj["recorded_at"],
            )
        ):
            counts["duplicate"] += 1
            continue
        counts[kind] += 1
        if kind == "server":
            store.put_server(
                ServerRecord(
                    obj["server"],
                    obj["info"],
                    obj.get("capabilities") or {},
                    obj.get("protocol_version"),
                    obj.get("instructions"),
                )
            )
        elif kind == "listing":
            store.put_listing(obj["server"], obj["method"], obj["result"])
        else:
            session = obj.get("session")
            if session is not None and session not in sessions:
                sessions.add(session)
                store.start_session(obj["server"], session, obj.get("recorded_at"))
            store.record_call(
                obj["server"],
                obj["method"],
                obj.get("params") or {},
                result=obj.get("result"),
                error=obj.get("error"),
                session=session,
                seq=obj.get("seq"),
                latency_ms=obj.get("latency_ms"),
                recorded_at=obj.get("recorded_at"),
                origin=obj.get("origin") or Origin.IMPORT,
                notifications=obj.get("notifications"),
            )


def merge(sources: Iterable[str | Path], out: str | Path) -> dict[str, int]:
    """Merge several stores into one (``out`` may exist); calls already in ``out`` are skipped.

    Args:
        sources: Store files to read.
        out: Destination store file.

    Returns:
        Total counts as :func:`import_jsonl` returns them.
    """
    totals = {"server": 0, "listing": 0, "call": 0, "duplicate": 0}
    with Store(out) as target:
        for source in sources:
            with Store(source, readonly=True) as store:
                counts = import_jsonl(
                    target, source, lines=[line.rstrip("\n") for line in export_lines(store)]
                )
            for kind, count in counts.items():
                totals[kind] += count
    return totals
