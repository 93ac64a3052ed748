"""A resolver serving a store that another connection records into meanwhile.

Another process may record, import or backfill into the store a replay serves. What the resolver
derived from the recordings must never go stale (a stale state is a wrong answer), and a commit
must not make it forget what the new calls did not touch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from replay_helpers import build_store, text_result

from replay_sim.canonical import call_key
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import ServerRecord, Store
from replay_sim.store.changes import Appended, changes_since

CALL = "tools/call"


def _key(server: str, name: str, **arguments: Any) -> str:
    return call_key(server, CALL, name, arguments)


INCREMENT = _key("demo", "increment")
INCREMENT_BY_3 = _key("demo", "increment", by=3)

PROBES: list[tuple[str, str, dict[str, Any], list[str]]] = [
    ("demo", "counter", {}, []),
    ("demo", "counter", {}, [INCREMENT]),
    ("demo", "counter", {}, [INCREMENT, INCREMENT]),
    ("demo", "counter", {}, [INCREMENT_BY_3]),
    ("demo", "echo", {"message": "hello"}, []),
    ("demo", "echo", {"message": "late"}, [INCREMENT]),
    ("demo", "echo", {"message": "x"}, []),
    ("demo", "echo", {"message": "x"}, [INCREMENT_BY_3]),
    ("demo", "echo", {"message": "never recorded"}, []),
    ("other", "ping", {}, []),
    ("other", "ping", {"n": 1}, []),
]


def _answers(resolver: Resolver) -> list[tuple[str, int | None, str | None]]:
    answers = []
    for server, name, arguments, history in PROBES:
        found = resolver.resolve(server, CALL, {"name": name, "arguments": arguments}, history)
        recording = found.recording
        answers.append((str(found.tier), None if recording is None else recording.id, found.problem))
    return answers


def _record(path: Path, session: str | None, calls: list[tuple[Any, ...]]) -> None:
    """Another connection records ``(server, tool, arguments, result or error[, seq])`` calls."""
    with Store(path) as other:
        if session is not None and other.sessions() and session not in {s["id"] for s in other.sessions()}:
            other.start_session(calls[0][0], session)
        for server, name, arguments, answer, *seq in calls:
            failed = isinstance(answer, dict) and "code" in answer
            other.record_call(
                server,
                CALL,
                {"name": name, "arguments": arguments},
                result=None if failed else text_result(answer),
                error=answer if failed else None,
                session=session,
                seq=seq[0] if seq else None,
            )


APPENDS: list[tuple[str, str | None, list[tuple[Any, ...]], bool]] = [
    ("a call of another server", None, [("other", "ping", {"n": 1}, "pong 1")], True),
    ("a new session reaching a new state", "s-2", [
        ("demo", "increment", {}, "ok"), ("demo", "increment", {}, "ok"), ("demo", "counter", {}, "2"),
    ], True),
    ("a call appended to a recorded session", "s-1", [("demo", "echo", {"message": "late"}, "late")], True),
    ("a state-changing call that failed, then a read", "s-3", [
        ("demo", "increment", {"by": 3}, {"code": -32602, "message": "by is not allowed"}),
        ("demo", "echo", {"message": "x"}, "x"),
    ], True),
    ("the same call succeeding: every recording of it now changes state", "s-4", [
        ("demo", "increment", {"by": 3}, "ok"), ("demo", "echo", {"message": "x"}, "x"),
    ], True),
    ("a call imported into a recorded session before its calls", "s-2", [
        ("demo", "increment", {"by": 3}, "ok", 0),
    ], True),
    ("a read answering otherwise from a recorded state: not read-only after all", "s-5", [
        ("demo", "counter", {}, "7"),
    ], True),
]  # fmt: skip
"""``(what, session, calls, whether some probe's answer changes)`` appended one after another."""


def _resolver(store: Store, embedder: SentenceTransformerEmbedder) -> Resolver:
    """Exact and canonical tiers (a miss names its nearest recordings with the model)."""
    return Resolver(store, index_dir=None, semantic=False, embedder=embedder)


def test_after_each_call_another_connection_appends_a_long_lived_resolver_answers_as_a_fresh_one(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    path = tmp_path / "served.db"
    served = _resolver(build_store(path), embedder)
    before = _answers(served)
    for what, session, calls, changes in APPENDS:
        _record(path, session, calls)
        with Store(path) as fresh_store:
            fresh = _answers(_resolver(fresh_store, embedder))
        assert _answers(served) == fresh, what
        assert (fresh != before) == changes, what  # the append is seen by some probe
        before = fresh


def test_a_call_recorded_for_one_server_leaves_what_was_learned_of_the_others(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    path = tmp_path / "served.db"
    served = _resolver(build_store(path), embedder)
    _answers(served)  # learns the tools' matching states (a call never recorded needs them)
    learned = served.tool_states.kept("demo", "echo")
    assert learned is not None
    _record(path, None, [("other", "ping", {"n": 1}, "pong 1")])
    _answers(served)
    assert served.tool_states.kept("demo", "echo") is learned


def test_a_listing_replaced_by_another_connection_forgets_everything(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    path = tmp_path / "served.db"
    served = _resolver(build_store(path), embedder)
    _answers(served)
    learned = served.tool_states.kept("demo", "echo")
    assert learned is not None
    with Store(path) as other:
        other.put_listing("other", "tools/list", {"tools": []})
    _answers(served)
    assert served.tool_states.kept("demo", "echo") is not learned  # learned again, from nothing kept


def test_changes_since_names_the_appended_calls_and_the_tools_of_the_sessions_they_joined(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    store = build_store(path)
    mark, first = changes_since(store, None)
    assert first is None  # nothing seen yet: everything is new
    assert changes_since(store, mark) == (mark, Appended())
    _record(path, "s-1", [("demo", "echo", {"message": "late"}, "late")])
    mark, appended = changes_since(store, mark)
    assert appended is not None
    assert appended.servers == {"demo"} and appended.sessions == {"s-1"}
    assert appended.keys == {_key("demo", "echo", message="late")}
    # every tool recorded in s-1: their recordings' prefixes now end differently
    assert {"echo", "counter", "increment", "slow"} <= {name for _, name in appended.tools}
    assert ("other", "ping") not in appended.tools


def test_changes_since_reports_a_commit_that_recorded_no_call_as_nothing_appended(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = build_store(path)
    mark, _ = changes_since(store, None)
    with Store(path) as other:
        other.set_meta("note", "kept by another process")
        other.cache_embeddings("model", {"sha": b"\0" * 4})
    after, appended = changes_since(store, mark)
    assert appended == Appended() and after != mark


@pytest.mark.parametrize("change", ["server", "listing"])
def test_changes_since_reports_a_replaced_server_or_listing_as_a_change_of_everything(
    tmp_path: Path, change: str
) -> None:
    path = tmp_path / "store.db"
    store = build_store(path)
    mark, _ = changes_since(store, None)
    with Store(path) as other:
        if change == "server":
            other.put_server(ServerRecord("other", {"name": "other", "version": "0.2"}, {"tools": {}}, None))
        else:
            other.put_listing("demo", "prompts/list", {"prompts": []})
    assert changes_since(store, mark)[1] is None


def test_a_key_read_before_gets_only_the_calls_appended_to_it_each_once(
    tmp_path: Path, embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key every episode calls has as many recordings as episodes: they are not all read again."""
    path = tmp_path / "served.db"
    served = _resolver(build_store(path), embedder)
    key = _key("demo", "echo", message="x")
    assert served.lookup.by_key(key) == []  # read (and kept) before anything is appended
    reads: list[int] = []
    recordings = Store.recordings

    def counted(self: Store, *args: Any, **kwargs: Any) -> Any:
        found = recordings(self, *args, **kwargs)
        if self is served.store and kwargs.get("key") == key:
            reads.append(len(found))
        return found

    monkeypatch.setattr(Store, "recordings", counted)
    for n in range(3):
        _record(path, f"s-x{n}", [("demo", "echo", {"message": "x"}, "x"), ("demo", "counter", {}, str(n))])
        served.catch_up()
        with Store(path) as fresh:
            assert [r.id for r in served.lookup.by_key(key)] == [r.id for r in fresh.recordings(key=key)]
    assert reads == [1, 1, 1]  # each append read alone, never the key's every recording
