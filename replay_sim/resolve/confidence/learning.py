"""Learning the confidence model at ``index build``: from the kept examples where the store only grew.

The model and its leave-one-out examples are kept in the index folder
(:data:`~.model.MODEL_FILE`, :data:`~.incremental.EXAMPLES_FILE`; a snapshot's id covers both).
``index build`` on a store that only grew since forms the examples of the new recordings and of
those they may have changed (:func:`~.incremental.plan`), keeps the rest, and fits the same model
on them all; ``full`` (``index build --full``), or anything else changed, forms every example.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.incremental import Kept, basis, fitted, plan, tool_counts
from replay_sim.resolve.confidence.leaveoneout import examples
from replay_sim.resolve.confidence.model import ConfidenceModel
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.store.changes import changes_since

__all__ = ["learn"]


def learn(
    store: Store,
    directory: Path,
    config: MatchConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    full: bool = False,
    keep: bool = True,
) -> ConfidenceModel:
    """Learn the confidence model of a store and keep it, and its examples, in its (current) index folder.

    Args:
        store: The recordings.
        directory: The index folder (built from ``store``); the model and examples are written there.
        config: The matching config the replay will use.
        progress: Called with ``(done, total)`` now and then (over the recordings whose examples
            are formed).
        full: Form every example, even where the kept ones could be reused.
        keep: Write the examples beside the model (a snapshot's bundle, whose model never changes,
            holds the model only).

    Returns:
        The model; ``source`` is ``incremental`` when kept examples were reused, and ``update``
        says how many were kept and how many recordings' examples were formed.

    Raises:
        VectorIndexError: The folder cannot be written.
    """
    resolver = Resolver(store, config=config, index_dir=directory, auto_index=False)
    mark, _ = changes_since(store, None)
    recordings = store.recordings()
    now = basis(resolver, {r.server for r in recordings})
    kept = None if full else Kept.load(directory)
    reuse = None if kept is None else plan(kept, recordings, now)
    if reuse is None:
        found = examples(resolver, progress, recordings=recordings)
        update = None
    else:
        found = reuse.keep + examples(resolver, progress, recordings=recordings, only=reuse.form)
        update = {
            "where": "index build",
            "kept": len(reuse.keep),
            "formed": len(reuse.form),
            "new": reuse.new,
        }
    on = (mark.calls, mark.last)
    model = fitted(found, tool_counts(recordings), on, update)
    if keep:
        Kept(tuple(found), on, now).save(directory)
    model.save(directory)
    return model
