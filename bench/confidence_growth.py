"""What learning the confidence model costs when the store grows: from scratch, or incrementally.

The second dev set's recordings (``fixtures/probes2``; then ten copies of it, servers and
sessions renamed: a store ten times larger grown by as many calls) are imported but for their
last ``GROW`` calls, indexed and the model learned as ``replay-sim index build`` does; then the held-out calls
are added (as a served store grows: sandbox answers, ``backfill``, an import) and the model is
brought up to date three ways, each timed (best of ``ROUNDS``):

- ``full``: ``index build --full`` — every recording's leave-one-out example formed again;
- ``index build``: the kept examples reused, those of the new recordings and of every recording
  of a tool that got new ones (or of a server whose effects changed) formed again;
- ``serving``: the refit a served writable store runs in the background
  (:meth:`~replay_sim.resolve.confidence.growing.Growth.refit`): the new recordings' examples
  only, the model fitted again and swapped in.

Reported: each one's seconds, how many recordings' examples it formed, and how far its weights
are from the full learn's (largest absolute difference, and the confidences of every example);
then what fitting alone costs (the model and its cross-validated calibration: six fits, each over
the distinct feature rows), which every way pays.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from replay_sim.resolve.confidence.incremental import Kept, fitted
from replay_sim.resolve.confidence.learning import learn
from replay_sim.resolve.confidence.model import ConfidenceModel
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.store.interchange import import_jsonl

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = ROOT / "fixtures" / "probes2" / "recordings.jsonl"
GROW = 20
"""Calls held out, then added."""
ROUNDS = 3
T = TypeVar("T")


def _copy(line: str, copy: int) -> str:
    """A recording line of the ``copy``-th copy of the dev set: its servers and sessions renamed."""
    if copy == 0:
        return line
    data = json.loads(line)
    data["server"] = f"{data['server']}-{copy}"
    if data.get("session"):
        data["session"] = f"{data['session']}-{copy}"
    return json.dumps(data)


def _split(copies: int) -> tuple[list[str], list[str]]:
    """The store's lines but for the first copy's last ``GROW`` calls, and those calls."""
    lines = RECORDINGS.read_text(encoding="utf-8").splitlines()
    calls = [i for i, line in enumerate(lines) if json.loads(line).get("type") == "call"]
    held = set(calls[-GROW:])
    base = [_copy(x, k) for k in range(copies) for i, x in enumerate(lines) if k or i not in held]
    return base, [lines[i] for i in sorted(held)]


def _timed(run: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    found = run()
    return time.perf_counter() - started, found


def _distance(model: ConfidenceModel, full: ConfidenceModel, kept: Kept) -> tuple[float, float]:
    """Largest weight difference, and largest confidence difference over the examples."""
    weights = float(np.max(np.abs(np.r_[model.bias - full.bias, np.subtract(model.weights, full.weights)])))
    rows = np.array([e.x for e in kept.examples])
    return weights, float(np.max(np.abs(model.predict_many(rows) - full.predict_many(rows))))


def measure(folder: Path, copies: int = 1) -> dict[str, dict[str, float]]:
    """Seconds, recordings formed and distance to the full learn, per way.

    Args:
        folder: Where the store and index folders are made.
        copies: Copies of the dev set in the store (servers and sessions renamed; the held-out
            calls are the first copy's): a larger store grown by as many calls.
    """
    base, grown = _split(copies)
    db, index = folder / "grow.db", folder / "index"
    with Store(db) as store:
        import_jsonl(store, RECORDINGS, base)
        Resolver(store, index_dir=index).index()
        learn(store, index)
        shutil.copytree(index, folder / "learned")
        import_jsonl(store, RECORDINGS, grown)
        Resolver(store, index_dir=index).index()  # the index is extended whichever way the model is
        shutil.copytree(index, folder / "grown")
        times: dict[str, list[float]] = {"full": [], "index build": [], "serving": []}
        models: dict[str, ConfidenceModel] = {}
        for _ in range(ROUNDS):
            for way, full in (("full", True), ("index build", False)):
                shutil.rmtree(index)
                shutil.copytree(folder / "grown", index)
                seconds, models[way] = _timed(partial(learn, store, index, full=full))
                times[way].append(seconds)
            shutil.rmtree(index)
            shutil.copytree(folder / "grown", index)
            for name in ("confidence.json", "confidence-examples.json"):
                shutil.copy(folder / "learned" / name, index / name)  # the model as served before it grew
            resolver = Resolver(store, index_dir=index)
            resolver.index()
            growth = resolver.confidence.growth
            assert growth is not None
            seconds, _ = _timed(partial(growth.refit, resolver))
            times["serving"].append(seconds)
            models["serving"] = resolver.confidence.model
        full_kept = Kept.load(index)
        assert full_kept is not None
        fits = [_timed(partial(fitted, full_kept.examples, {}, full_kept.on))[0] for _ in range(ROUNDS)]
    found: dict[str, dict[str, float]] = {}
    for way, model in models.items():
        weights, confidence = _distance(model, models["full"], full_kept)
        update = model.update or {}
        found[way] = {
            "seconds": min(times[way]),
            "formed": float(update["formed"] if way != "full" else (model.learned_on or (0, 0))[0]),
            "examples": float(model.examples),
            "weights": weights,
            "confidence": confidence,
        }
    found["fit"] = {"seconds": min(fits)}
    return found


def main(copies: tuple[int, ...] = (1, 10)) -> None:
    """Print each way's time, examples formed and distance to the full learn, per store size."""
    for n in copies:
        folder = Path(tempfile.mkdtemp(prefix="replay-sim-bench-"))
        try:
            found = measure(folder, n)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        what = RECORDINGS.relative_to(ROOT)
        size = f" x {n} (servers renamed)" if n > 1 else ""
        print(f"   {what}{size} less {GROW} calls, learned; grown by them:")
        fit = found.pop("fit")["seconds"]
        for way, row in found.items():
            print(
                f"   {way:>11}: {row['seconds'] * 1000:7.1f} ms, {row['formed']:.0f} recordings' examples "
                f"formed, {row['examples']:.0f} examples; vs full: weights within {row['weights']:.4f}, "
                f"confidences within {row['confidence']:.4f}"
            )
        print(f"   of each, fitting the model and its 5-fold calibration: {fit * 1000:.1f} ms")


if __name__ == "__main__":
    main(tuple(int(n) for n in sys.argv[1:]) or (1, 10))
