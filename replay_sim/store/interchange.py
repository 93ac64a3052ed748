"""JSONL interchange: ``replay-sim import`` and ``export`` (the format is a contract, see DESIGN.md).

One object per line, ``type`` first: ``server``, ``listing`` and ``call`` lines; lines end in ``\\n``
(only: U+2028, U+2029 and U+0085 are written raw inside strings, as JSON allows). Export writes
servers, then listings, then calls in recorded order, with a fixed key order, so that
export → import → export is byte-identical.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from replay_sim.errors import InterchangeError
from replay_sim.store import Origin, ServerRecord, Store
from replay_sim.store.lines import parse_line

__all__ = ["export_jsonl", "fold_in", "import_jsonl", "merge"]


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


def import_jsonl(
    store: Store,
    path: str | Path,
    lines: Iterable[str] | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    declared: bool = True,
    within: Callable[[Store], None] | None = None,
) -> dict[str, int]:
    """Read a JSONL file into the store, all of it or nothing: every line is checked before any is written.

    The file is read as a stream (one line in memory at a time) and split on ``\\n`` only: U+2028,
    U+2029 and U+0085 are text inside a line. It is read twice: first every line is checked against
    the format (:func:`~replay_sim.store.lines.parse_line`) and every listing's and call's server
    against the servers declared (a ``server`` line of the file, or a server the store holds), with
    nothing written and no lock taken; then the lines are written in one transaction (checked again
    as they are, so a file changed in between still rolls back whole).

    Args:
        store: Destination store.
        path: The file (also used in error messages).
        lines: Already-open lines (without their newline), instead of reading ``path``.
        progress: Called with (bytes read, the file's size) as the file is read: once as it is
            checked, once more as it is written (not with ``lines``).
        declared: Refuse a listing or call whose server is not declared (off for :func:`fold_in`:
            a store is copied as it is).
        within: Called with the store in the import's transaction once the lines are written (to
            write more in the same commit).

    Returns:
        Counts of imported ``server``, ``listing`` and ``call`` lines, and of ``duplicate`` calls
        skipped because the store holds them already (importing twice changes nothing).

    Raises:
        InterchangeError: The file cannot be read, or a line is not UTF-8, not JSON, not a line of
            the format, or names a server no line declares (names file, line and field).
    """
    path = Path(path)
    if lines is not None:
        lines = list(lines)
    with contextlib.ExitStack() as stack:
        read = lines if lines is not None else _read_lines(path, stack, progress)
        _check_all(store, path, read, declared)
    counts = {"server": 0, "listing": 0, "call": 0, "duplicate": 0}
    writer = _Writer(store, counts)
    with contextlib.ExitStack() as stack:
        read = lines if lines is not None else _read_lines(path, stack, progress)
        stack.enter_context(store.transaction(f"import {path}"))
        for number, text in enumerate(read, start=1):
            parsed = parse_line(text, f"{path}:{number}")
            if parsed is not None:
                writer.write(*parsed)
        if within is not None:
            within(store)
    return counts


def _check_all(store: Store, path: Path, lines: Iterable[str], declared: bool) -> None:
    """Check every line, and that every listing's and call's server is declared; write nothing.

    Raises:
        InterchangeError: The first bad line, or the first line naming an undeclared server.
    """
    servers: set[str] = set()
    first_use: dict[str, int] = {}  # each server a listing or call names: the first line naming it
    for number, text in enumerate(lines, start=1):
        parsed = parse_line(text, f"{path}:{number}")
        if parsed is None:
            continue
        kind, obj = parsed
        if kind == "server":
            servers.add(obj["server"])
        elif declared:
            first_use.setdefault(obj["server"], number)
    for server, number in sorted(first_use.items(), key=lambda item: item[1]):
        if server not in servers and store.server(server) is None:
            raise InterchangeError(
                f"{path}:{number}: field 'server': {server!r} is not declared: the file has no server "
                f"line for it and the store does not hold it (add its "
                f'{{"type":"server","server":{json.dumps(server, ensure_ascii=False)},"info":{{...}}}} line)'
            )


def _read_lines(
    path: Path, stack: contextlib.ExitStack, progress: Callable[[int, int], None] | None = None
) -> Iterator[str]:
    """The file's lines, split on ``\\n`` only and decoded one by one (a bad byte names its line)."""
    try:
        file = stack.enter_context(path.open("rb"))
        size = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise InterchangeError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return _decoded(path, file, None if progress is None else (progress, size))


def _decoded(
    path: Path, file: IO[bytes], progress: tuple[Callable[[int, int], None], int] | None = None
) -> Iterator[str]:
    number = read = 0
    while True:
        try:
            raw = file.readline()
        except OSError as exc:
            raise InterchangeError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        if not raw:
            return
        number += 1
        if progress is not None:
            read += len(raw)
            if number % 1024 == 0 or read == progress[1]:
                progress[0](read, progress[1])
        try:
            yield raw.removesuffix(b"\n").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InterchangeError(f"{path}:{number}: not UTF-8 (byte {exc.start + 1})") from None


class _Writer:
    """Writes checked lines to the store (in the import's transaction), counting them."""

    def __init__(self, store: Store, counts: dict[str, int]) -> None:
        self.store = store
        self.counts = counts
        self.sessions: set[str] = set()

    def write(self, kind: str, obj: dict[str, Any]) -> None:
        store = self.store
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
            self.counts["duplicate"] += 1
            return
        self.counts[kind] += 1
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
            if session is not None and session not in self.sessions:
                self.sessions.add(session)
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


def fold_in(target: Store, source: str | Path) -> dict[str, int]:
    """Import another store's content into ``target`` (one transaction); calls it has are skipped.

    Args:
        target: The store written to.
        source: The store file read (never written).

    Returns:
        Counts as :func:`import_jsonl` returns them.

    Raises:
        StoreError: ``source`` is missing or cannot be read.
    """
    with Store(source, readonly=True) as store:
        lines = [line.rstrip("\n") for line in export_lines(store)]
        return import_jsonl(target, source, lines=lines, declared=False)


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
            counts = fold_in(target, source)
            for kind, count in counts.items():
                totals[kind] += count
    return totals
