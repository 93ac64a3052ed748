"""What judging tool effects costs per batch of answers as a served store grows: all again, or incrementally.

While ``replay-sim serve --miss sandbox`` serves, a batch of sandbox answers is recorded every 50 ms
and each batch has the server's tool effects learned again. This builds the judge's input directly
(:class:`~replay_sim.effects.Call` objects, no store: reading the calls is incremental already) for
two servers, episodes of ``CONCURRENCY`` at a time each adding its next call in turn, ``BATCH``
calls a batch:

- ``memory``: the shape of ``bench.sandbox_scale`` — each episode creates an entity nobody
  recorded, adds an observation, opens it and reads the graph (writes annotated
  ``readOnlyHint: false``, reads ``readOnlyHint: true``);
- ``undeclared``: nothing annotated — each episode reads a shared file, writes its own, reads the
  shared file again, computes something (a pure tool whose answers vary), lists the folder and
  reads its own file: witnesses, contrary evidence and several passes to a fixpoint.

At each size (recorded calls) the learner is grown to it batch by batch, then the next ``ROUNDS``
batches are timed two ways: ``full`` learns over every call (:func:`~replay_sim.effects.learn`,
what each batch cost before the learner), ``incremental`` folds in the batch's calls
(:class:`~replay_sim.effects.Learner`). Reported: milliseconds per batch, their ratio, and the
incremental learner's work in those batches — passes built over every call, calls compared again
(their group moved) — after checking that both give the same verdicts.

Run with ``python -m bench effects_growth`` (or ``python -m bench.effects_growth [CALLS ...]``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator

from replay_sim.effects import Call, Declaration, Learner, Verdict, declare, learn

SIZES = (200, 2_000, 10_000)
CONCURRENCY = 16
BATCH = 8
ROUNDS = 20

Episode = Callable[[int, Iterator[int]], list[Call]]


def _call(
    ids: Iterator[int], tool: str, argument: str, answer: str, names: frozenset[str] = frozenset()
) -> Call:
    return Call(next(ids), "tools/call", tool, f"{tool}({argument})", answer, False, False, names)


def memory(episode: int, ids: Iterator[int]) -> list[Call]:
    """An episode as ``bench.sandbox_scale`` plays: create an entity, add an observation, open it, read
    the graph."""
    entity = f"run-e{episode:05d}"
    names = frozenset({entity.lower()})
    graph = f'{{"entities":[{{"name":"{entity}","observations":["seen"]}}]}}'
    return [
        _call(ids, "create_entities", entity, f'[{{"name":"{entity}"}}]', names),
        _call(ids, "add_observations", entity, f'[{{"entityName":"{entity}","added":["seen"]}}]', names),
        _call(ids, "open_nodes", entity, graph, names),
        _call(ids, "read_graph", "", graph),
    ]


MEMORY_DECLARED = {
    "create_entities": declare({"readOnlyHint": False}),
    "add_observations": declare({"readOnlyHint": False}),
    "open_nodes": declare({"readOnlyHint": True}),
    "read_graph": declare({"readOnlyHint": True}),
}


def undeclared(episode: int, ids: Iterator[int]) -> list[Call]:
    """An episode on a server that annotates nothing: reads, a write, a pure tool, a listing."""
    own, shared = f"/data/e{episode}.txt", "/data/shared.txt"
    return [
        _call(ids, "read_file", shared, "shared text", frozenset({shared})),
        _call(ids, "write_file", own, "ok", frozenset({own})),
        _call(ids, "read_file", shared, "shared text", frozenset({shared})),
        _call(ids, "calc", str(episode % 7), str(episode % 7 * 2)),
        _call(ids, "list_dir", "/data", f"shared.txt e{episode}.txt", frozenset({"/data"})),
        _call(ids, "read_file", own, f"episode {episode}", frozenset({own})),
    ]


def batches(episode: Episode) -> Iterator[list[tuple[int, Call]]]:
    """``BATCH`` calls at a time, ``(session, call)``: the next call of each running episode in turn."""
    ids = iter(range(1, 10**9))
    started, running = 0, {}
    while True:
        batch = []
        while len(batch) < BATCH:
            while len(running) < CONCURRENCY:
                running[started] = iter(episode(started, ids))
                started += 1
            for session in list(running):
                call = next(running[session], None)
                if call is None:
                    del running[session]
                elif len(batch) < BATCH:
                    batch.append((session, call))
                else:
                    running[session] = _pushed_back(call, running[session])
        yield batch


def _pushed_back(call: Call, rest: Iterator[Call]) -> Iterator[Call]:
    yield call
    yield from rest


def measure(episode: Episode, declared: dict[str, Declaration], size: int) -> dict[str, float]:
    """Per-batch milliseconds at ``size`` recorded calls: learning over every call, and incrementally."""
    sessions: list[list[Call]] = []
    learner = Learner()
    feed = batches(episode)

    def grow() -> None:
        for session, call in next(feed):
            while session >= len(sessions):
                sessions.append([])
            sessions[session].append(call)

    while sum(map(len, sessions)) < size:
        grow()
        learner.learn(sessions, declared)
    recorded = sum(map(len, sessions))
    built, again = learner.passes
    incremental = full = 0.0
    verdicts: dict[str, Verdict] = {}
    for _ in range(ROUNDS):
        grow()
        started = time.perf_counter()
        verdicts = learner.learn(sessions, declared)
        incremental += time.perf_counter() - started
        started = time.perf_counter()
        whole = learn(sessions, declared)
        full += time.perf_counter() - started
    if verdicts != whole or learner.started_over:
        raise AssertionError(f"the incremental verdicts differ from a full learn's at {size} calls")
    return {
        "calls": recorded,
        "full": full / ROUNDS * 1000,
        "incremental": incremental / ROUNDS * 1000,
        "built": learner.passes[0] - built,
        "again": learner.passes[1] - again,
    }


def main(sizes: tuple[int, ...] = SIZES) -> None:
    """Print the per-batch judging cost, full and incremental, for each server shape and size."""
    print(
        f"judging tool effects per batch of {BATCH} answers ({CONCURRENCY} episodes at a time; "
        f"mean of {ROUNDS} batches)"
    )
    print("server       calls   full ms   incremental ms   ratio   passes built   compared again")
    for name, episode, declared in (("memory", memory, MEMORY_DECLARED), ("undeclared", undeclared, {})):
        for size in sizes:
            row = measure(episode, declared, size)
            print(
                f"{name:<11} {row['calls']:>6,}   {row['full']:>7.2f}   {row['incremental']:>14.3f}   "
                f"{row['full'] / row['incremental']:>5.0f}x   {row['built']:>12.0f}   {row['again']:>14.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or SIZES)
