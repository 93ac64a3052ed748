"""The served model refitted as a writable store grows: off the answer path, swapped in whole.

While a writable store is served, recordings are added to it — sandbox answers, ``backfill``, an
import or a recorder in another process. The judge (:class:`~.judge.Confidence`) tells
:class:`Growth` when it sees the store past what its model was learned on; a background thread
then, at most every :attr:`Growth.interval` seconds, forms the leave-one-out examples of up to
:attr:`Growth.batch` recordings added since (as ``index build`` forms them: the candidate the rest
of the store offers each from its session prefix, :func:`~.leaveoneout.examples`), fits the model
again on the kept examples plus the new ones (:func:`~.incremental.fitted`: the fit costs the same
on any number of examples, each distinct row fitted once) and hands it to the judge, which swaps it
in and forgets what it judged with the old one. The model and examples are written back to the
index folder (as the grown index is), so the next ``index build`` starts from them.

Only the new recordings' examples are formed here: those of older recordings of the same tools
(whose candidates the new ones may change) are left as they were, and their tools are marked
stale for the next ``index build`` to form again (:attr:`~.incremental.Kept.stale`). A read-only
store (a served snapshot) never changes its model: what a snapshot id names is what is served.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from replay_sim.errors import ReplaySimError
from replay_sim.resolve.confidence.forming import Resolver
from replay_sim.resolve.confidence.incremental import Kept, digest, fitted, tool_counts
from replay_sim.resolve.confidence.leaveoneout import examples
from replay_sim.resolve.confidence.model import ConfidenceModel
from replay_sim.store import Recording

__all__ = ["Growth"]


class Growth:
    """Refits a served model from the kept examples as its writable store grows (a daemon thread).

    Args:
        directory: The index folder whose kept examples (:class:`~.incremental.Kept`) are grown;
            without them (a model learned before they were kept, or none) the model is left as it is.
        adopt: Called with each refitted model (the judge swaps it in).
        model: The model served now (its ``update`` is carried on).
    """

    interval = 30.0
    """At least this many seconds between two refits, and from the start to the first (recordings
    added meanwhile are batched). A fit costs ~0.3 s of CPU whatever the examples; a store growing
    by a batch of sandbox answers every 50 ms refitted every 2 s gave 15 % of a core to it."""
    batch = 500
    """At most this many new recordings' examples are formed per refit (the rest at the next)."""

    def __init__(
        self, directory: Path, adopt: Callable[[ConfidenceModel], None], model: Callable[[], ConfidenceModel]
    ) -> None:
        self.directory = directory
        self._adopt = adopt
        self._model = model
        self._kept: Kept | None = None
        self._off = False  # nothing to grow from (no kept examples), or not this store's
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self.refits = 0
        """Refits adopted so far (what a test or the dashboard may wait on)."""

    def grew(self, resolver: Resolver) -> None:
        """Say the store grew past the model (cheap: the refit runs in the background)."""
        if self._off or resolver.store.readonly:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(resolver,), name="replay-sim-confidence-refit", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self, resolver: Resolver) -> None:
        while not self._off:
            self._wake.wait()
            wait = self._last + self.interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # batch what arrives meanwhile (not on any answer's path)
            self._wake.clear()
            self._last = time.monotonic()
            try:
                if self.refit(resolver):
                    self._wake.set()  # more new recordings than one batch: the next refit goes on
            except ReplaySimError:
                self._off = True  # the store is closed or unreadable: serving goes on with the model

    def refit(self, resolver: Resolver) -> bool:
        """Form the examples of up to :attr:`batch` new recordings, refit and adopt the model.

        Returns:
            Whether more new recordings wait for the next refit.

        Raises:
            ReplaySimError: The store cannot be read.
        """
        kept = self._kept or Kept.load(self.directory)
        model = self._model()
        if (
            kept is None
            or model.learned_on is None
            or kept.basis.get("config") != digest(resolver.config.as_dict())
        ):
            self._off = True  # no examples kept, or of another config: only `index build` learns it
            return False
        calls, last = kept.on
        mark = resolver.version()
        if mark is not None and (mark.calls < calls or mark.last < last):
            self._off = True  # recordings taken back: not a grown store (`index build` learns it again)
            return False
        new = resolver.store.recordings(after_id=last, limit=self.batch + 1)
        more, new = len(new) > self.batch, new[: self.batch]
        if not new:
            self._kept = kept
            return False
        population = _around(resolver, new)
        formed = examples(resolver, recordings=population, only={r.id for r in new})
        on = (calls + len(new), new[-1].id)
        touched = {(r.server, r.method, r.name) for r in new}
        counted = tool_counts(
            r for r in population if (r.server, r.method, r.name) in touched and r.id <= on[1]
        )
        found = [*kept.examples, *formed]
        before = model.update if model.update and model.update.get("where") == "serving" else {}
        update = {
            "where": "serving",
            "kept": len(kept.examples),
            "formed": len(new),
            "refits": int(before.get("refits", 0)) + 1,
        }
        grown = fitted(found, {**(model.tools or {}), **counted}, on, update)
        self._kept = Kept(tuple(found), on, kept.basis, kept.stale | touched)
        try:  # written before it is served: a refit counted is a refit on disk
            self._kept.save(self.directory)
            grown.save(self.directory)
        except ReplaySimError:
            pass  # an index folder this process cannot write: the refitted model is served from memory
        self._adopt(grown)
        self.refits += 1
        return more


def _around(resolver: Resolver, new: list[Recording]) -> list[Recording]:
    """The new recordings' whole sessions and tools: their session prefixes and their tools' counts."""
    store = resolver.store
    found = {r.id: r for r in new}
    for session in {r.session for r in new if r.session is not None}:
        found.update((r.id, r) for r in store.recordings(session=session))
    for server, method, name in {(r.server, r.method, r.name) for r in new}:
        found.update((r.id, r) for r in store.recordings(server, method=method, name=name))
    return [found[i] for i in sorted(found)]
