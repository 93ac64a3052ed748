"""Each tool's repeated-call counts as a store grows: the recordings added since, and all after a removal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay_sim.resolve.confidence.features import repeated_calls
from replay_sim.resolve.confidence.repeats import RepeatedCalls
from replay_sim.store import Recording, Store
from replay_sim.store.forget import Selection, forget
from replay_sim.store.sources import mark_session


def _echo(store: Store, session: str, n: int, answer: str) -> None:
    store.record_call(
        "echo", "tools/call", {"name": "echo", "arguments": {"n": n}},
        result={"content": [{"type": "text", "text": answer}]}, session=session,
    )  # fmt: skip


def test_counts_follow_a_growing_store_reading_each_recording_once(tmp_path: Path) -> None:
    read: list[int] = []
    with Store(tmp_path / "r.db") as store:
        recordings = store.recordings

        def counting(*args: Any, **kwargs: Any) -> list[Recording]:
            found = recordings(*args, **kwargs)
            read.extend(r.id or 0 for r in found)
            return found

        store.recordings = counting  # type: ignore[method-assign]
        counted = RepeatedCalls()
        store.start_session("echo", "s-1")
        _echo(store, "s-1", 1, "one")
        _echo(store, "s-1", 1, "one")  # a repeat that agrees
        assert counted.of(store, "echo", "tools/call", "echo") == (1, 0)
        store.start_session("echo", "s-2")
        _echo(store, "s-2", 1, "uno")  # now it disagrees
        _echo(store, "s-2", 2, "two")
        assert counted.of(store, "echo", "tools/call", "echo") == (0, 1)
        assert sorted(read) == [1, 2, 3, 4]  # each once
        everything = repeated_calls(recordings("echo", name="echo"))
        assert counted.of(store, "echo", "tools/call", "echo") == everything


def test_calls_taken_back_are_counted_again_from_what_is_left(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        counted = RepeatedCalls()
        for session, answer in (("live", "one"), ("sandboxed", "uno")):
            store.start_session("echo", session)
            _echo(store, session, 1, answer)
        mark_session(store, "sandboxed", "fp-aaaaaaaa", {"server": "echo"})
        assert counted.of(store, "echo", "tools/call", "echo") == (0, 1)
        forget(store, Selection(fingerprint="fp-aaaaaaaa"), dry_run=False)
        store.start_session("echo", "later")
        _echo(store, "later", 1, "one")  # the removed id given again: agrees now
        assert counted.of(store, "echo", "tools/call", "echo") == (1, 0)


def test_leave_one_out_counts_a_tools_calls_without_the_hidden_recording_as_a_full_count_does(
    tmp_path: Path,
) -> None:
    """Leave-one-out keeps each tool's counts per call and takes the hidden recording out in constant
    time: for every recording, what a count over all the others gives."""
    from replay_sim.resolve.confidence.features import CallAnswers
    from replay_sim.resolve.toolstate import answer_of

    with Store(tmp_path / "r.db") as store:
        for i, (n, answer) in enumerate(
            [(1, "a"), (1, "a"), (2, "b"), (2, "c"), (3, "d"), (4, "e"), (4, "e")]
        ):
            _echo(store, f"s{i}", n, answer)
        _echo(store, "s9", 2, "b")
        recs = store.recordings("echo")
    counts = CallAnswers()
    for rec in recs:
        counts.add(rec.key, answer_of(rec))
    assert counts.counts() == repeated_calls(recs) == (2, 1)
    for rec in recs:
        assert counts.without(rec.key, answer_of(rec)) == repeated_calls(recs, exclude=rec.id), rec
