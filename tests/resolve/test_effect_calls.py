"""What learning tool effects reads of a growing store: each call once, and all again after a removal;
and what it judges: the calls added, with a fresh read's verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store_helpers import echo_call

from replay_sim.effects import Call, Effect
from replay_sim.resolve import tooleffects
from replay_sim.resolve.calibration import MatchConfig, ToolOverride
from replay_sim.resolve.effectcalls import server_runs
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.tooleffects import recorded_effects
from replay_sim.store import Store
from replay_sim.store.forget import Selection, forget
from replay_sim.store.sources import mark_session


class Counting:
    """Counts the calls a store's ``outcomes`` hands back (what was read and derived)."""

    def __init__(self, store: Store) -> None:
        self.read = 0
        self._outcomes = store.outcomes

        def outcomes(server: str, after: int = 0) -> list[tuple[Any, ...]]:
            rows = self._outcomes(server, after)
            self.read += len(rows)
            return rows

        store.outcomes = outcomes  # type: ignore[method-assign]


def _fresh(path: Path) -> tuple[list[list[Call]], set[str]]:
    with Store(path) as store:
        return server_runs(store, "echo")


def _write(store: Store, session: str, n: int, answer: str | None = None) -> None:
    """An ``echo``-server call of tool ``write`` (answered ``answer``, else an error) in ``session``."""
    store.record_call(
        "echo", "tools/call", {"name": "write", "arguments": {"n": n}},
        result=None if answer is None else {"content": [{"type": "text", "text": answer}]},
        error={"code": -32000, "message": "no"} if answer is None else None, session=session,
    )  # fmt: skip


def test_calls_added_since_are_the_only_ones_read_and_the_runs_are_a_fresh_reads(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with Store(path) as store:
        store.start_session("echo", "s-1")
        echo_call(store, 1, "s-1")
        _write(store, "s-1", 1)  # failed, never succeeded: inert
        counting = Counting(store)
        assert server_runs(store, "echo") == _fresh(path) and counting.read == 2
        store.start_session("echo", "s-2")
        _write(store, "s-2", 1, "ok")  # the same call succeeding: the failed one is no longer inert
        echo_call(store, 2, "s-2")
        runs, called = server_runs(store, "echo")
        assert counting.read == 4  # the two added, not the four
        assert (runs, called) == _fresh(path) and called == {"echo", "write"}
        first = runs[0] if runs[0][0].id == 1 else runs[1]
        assert [call.inert for call in first] == [False, False]
        assert server_runs(store, "echo") == _fresh(path) and counting.read == 4  # nothing added


def test_calls_taken_back_make_every_call_be_read_again(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with Store(path) as store:
        for n, session in enumerate(("live", "sandboxed"), 1):
            store.start_session("echo", session)
            echo_call(store, n, session)
        mark_session(store, "sandboxed", "fp-aaaaaaaa", {"server": "echo"})
        counting = Counting(store)
        assert len(server_runs(store, "echo")[0]) == 2
        forget(store, Selection(fingerprint="fp-aaaaaaaa"), dry_run=False)
        store.start_session("echo", "later")
        added = echo_call(store, 3, "later")  # as many calls as before, the removed id given again
        assert added == 2
        runs, _ = server_runs(store, "echo")
        assert (runs, _) == _fresh(path)
        assert sorted(call.answer for run in runs for call in run) == [
            '{"error":null,"result":{"content":[{"text":"1","type":"text"}]}}',
            '{"error":null,"result":{"content":[{"text":"3","type":"text"}]}}',
        ]
        assert counting.read == 2 + 2  # all, then all again


def test_a_grown_stores_runs_are_a_fresh_reads_at_every_step_even_recorded_out_of_order(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.db"
    steps: list[tuple[str, int, str | None, int | None]] = [  # (session, n, answer, seq)
        ("s-1", 1, None, None),  # failed: inert while `write 1` never succeeded
        ("s-1", 2, "ok", None),
        ("s-2", 1, None, None),
        ("s-3", 3, "ok", 5),
        ("s-3", 4, "ok", 2),  # recorded after, but earlier in its session (an import): sorted in
        ("s-2", 1, "ok", None),  # `write 1` succeeds: the failed ones before it are no longer inert
        ("s-1", 5, None, None),
        ("s-3", 6, "ok", 1),
    ]
    with Store(path) as store:
        for session, n, answer, seq in steps:
            store.start_session("echo", session)  # once: a session started again is left as it is
            store.record_call(
                "echo", "tools/call", {"name": "write", "arguments": {"n": n}},
                result=None if answer is None else {"content": [{"type": "text", "text": answer}]},
                error={"code": -32000, "message": "no"} if answer is None else None, session=session, seq=seq,
            )  # fmt: skip
            assert server_runs(store, "echo") == _fresh(path)
        runs, _ = server_runs(store, "echo")
        assert [call.inert for call in runs[0]] == [False, False, True]  # `write 5` never succeeded
        assert [call.id for call in runs[2]] == [8, 5, 4]  # by their seq: 1, 2, 5


def test_a_growing_stores_effects_learned_after_each_batch_are_a_fresh_stores(tmp_path: Path) -> None:
    """Served, each batch of answers has the effects judged for its calls alone: the same verdicts."""
    path = tmp_path / "r.db"
    batches = [  # (session, tool, argument, answer): `put` is seen to change `get`'s answer at last
        [("s-1", "get", "a", "1"), ("s-1", "calc", "2", "4"), ("s-1", "get", "a", "1")],
        [("s-2", "calc", "3", "6"), ("s-2", "get", "a", "1"), ("s-1", "calc", "3", "6")],
        [("s-1", "get", "a", "1"), ("s-3", "put", "b", "ok"), ("s-3", "get", "a", "1")],
        [("s-3", "put", "a", "ok"), ("s-3", "get", "a", "2"), ("s-2", "get", "a", "1")],
    ]
    config = MatchConfig(tools={"echo/get": ToolOverride(read_only=True)})
    with Store(path) as store:
        schemas = RecordedSchemas(store, config)
        for batch in batches:
            for session, tool, argument, answer in batch:
                store.start_session("echo", session)
                store.record_call(
                    "echo", "tools/call", {"name": tool, "arguments": {"x": argument}},
                    result={"content": [{"type": "text", "text": answer}]}, session=session,
                )  # fmt: skip
            learned = recorded_effects(store, "echo", schemas, config)
            with Store(path) as fresh:
                assert learned == recorded_effects(fresh, "echo", RecordedSchemas(fresh, config), config)
        assert learned["calc"].effect is Effect.NONE and learned["put"].effect is Effect.CHANGES
        learner, _ = tooleffects._learners.of(store, "echo")
        assert learner.started_over == 0  # each batch was judged alone
