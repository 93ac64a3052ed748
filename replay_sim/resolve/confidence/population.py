"""What fifteen real servers showed: the prior a store's own examples are weighed against.

A store's leave-one-out examples (:mod:`.leaveoneout`) are few in a small store, and skewed: a
hidden recording was usually recorded once, so its candidates are mostly nearest recordings and
recordings from states whose gap wrote, and most are wrong. Fitted on them alone, toward the
hand-written :data:`~.model.PRIOR`, the model was under-confident on every dev set where
candidates from other states are common (cross-validated by server, candidates it put at 0.0 -
0.1 were right 45 - 47 % of the time on the second and third).

The *population* is evidence of the real thing: every candidate the resolver forms for a step of
the committed dev probe sets (``fixtures/probes``, ``probes2``, ``probes3``: fifteen real servers),
labelled by what the live server answered. Its feature rows, with how often each was right and
wrong on each server, are kept in ``population.json`` (``fixtures/population.py`` writes it with
:func:`~.reliability.observe`). :func:`prior` is the model fitted on them toward the hand-written
prior; a store's examples are fitted toward it in turn (:func:`~.leaveoneout.learn_from`), each
feature moving as far as the store's own evidence of it carries. ``eval --calibration`` leaves the
scored server out of both, so no model is scored on a server it learned from.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.resolve.confidence.diagram import as_json
from replay_sim.resolve.confidence.features import FEATURES
from replay_sim.resolve.confidence.model import PRIOR, ConfidenceModel, fit

__all__ = [
    "POPULATION_FILE",
    "STRENGTH",
    "Observed",
    "fitted",
    "prior",
    "rows",
    "summary",
    "validated",
    "write",
]

POPULATION_FILE = Path(__file__).with_name("population.json")
"""The population's feature rows (``fixtures/population.py`` writes it)."""
STRENGTH = 100.0
"""How many of a store's own examples of a feature weigh as much as the population's: a store's
fit is pulled toward :func:`prior` as if by this many examples of each weight."""
_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Observed:
    """Candidates of one server with the same features: how many were right and how many wrong."""

    server: str
    features: tuple[str, ...]
    right: int
    wrong: int


def write(observed: Sequence[Observed], path: Path = POPULATION_FILE) -> None:
    """Write the population file: its rows (one per server and feature set, sorted: a stable diff)
    and how well calibrated its model is (:func:`validated`)."""
    body = [
        {"server": o.server, "features": list(o.features), "right": o.right, "wrong": o.wrong}
        for o in sorted(observed, key=lambda o: (o.server, o.features))
    ]
    head = {"format": _FORMAT, "features": [f.name for f in FEATURES], "validated": validated(observed)}
    lines = ",\n".join(json.dumps(row) for row in body)
    path.write_text(f'{json.dumps(head)[:-1]}, "rows": [\n{lines}\n]}}\n', encoding="utf-8")


@cache
def _file() -> dict[str, Any]:
    try:
        data = json.loads(POPULATION_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        return {}
    if data.get("features") != [f.name for f in FEATURES]:
        return {}  # written for another feature set: its rows mean something else
    return data


def rows() -> tuple[Observed, ...]:
    """The shipped population (empty when its file is missing or of another feature set)."""
    return tuple(
        Observed(r["server"], tuple(r["features"]), r["right"], r["wrong"]) for r in _file().get("rows", ())
    )


def summary() -> dict[str, Any] | None:
    """The shipped population's calibration, as written with it (:func:`validated`)."""
    found = _file().get("validated")
    return found if isinstance(found, dict) else None


def prior(leave_out: frozenset[str] = frozenset()) -> ConfidenceModel:
    """The shipped population's model, its servers in ``leave_out`` unused (:func:`fitted`); the
    whole population's carries its calibration (:func:`summary`)."""
    return _prior(leave_out & {o.server for o in rows()})  # names it does not hold: the same fit


@cache
def _prior(leave_out: frozenset[str]) -> ConfidenceModel:
    model = fitted([o for o in rows() if o.server not in leave_out])
    return model if leave_out or model is PRIOR else dataclasses.replace(model, calibration=summary())


def fitted(observed: Sequence[Observed]) -> ConfidenceModel:
    """The model fitted on observed candidates toward :data:`PRIOR` (:data:`PRIOR` for none).

    The base (an exact repeat from the episode's state) is held as the store's fit holds it.
    """
    if not observed:
        return PRIOR
    x = np.repeat(_vectors(observed), 2, axis=0)  # each row once right, once wrong, by its counts
    labels = np.tile([1.0, 0.0], len(observed))
    counts = np.array([n for o in observed for n in (o.right, o.wrong)], dtype=float)
    bias, weights = fit(x, labels, counts=counts)
    right = sum(o.right for o in observed)
    return ConfidenceModel(bias, weights, int(counts.sum()), right, source="population")


def validated(observed: Sequence[Observed]) -> dict[str, Any] | None:
    """How well calibrated the population's model is on real answers: each server's candidates
    scored by the model fitted without it. Shaped as :func:`~.leaveoneout.validated`'s summary
    (``validated``, ``folds``, ``examples``, ``ece``, ``bins``); None for fewer than two servers."""
    servers = sorted({o.server for o in observed})
    if len(servers) < 2:
        return None
    pairs: list[tuple[float, bool]] = []
    for server in servers:
        own = [o for o in observed if o.server == server]
        scores = fitted([o for o in observed if o.server != server]).predict_many(_vectors(own))
        for o, score in zip(own, scores, strict=True):
            pairs += [(float(score), True)] * o.right + [(float(score), False)] * o.wrong
    return as_json(pairs, "by server", len(servers))


def _vectors(observed: Sequence[Observed]) -> np.ndarray:
    index = {f.name: i for i, f in enumerate(FEATURES)}
    x = np.zeros((len(observed), len(FEATURES)))
    for i, o in enumerate(observed):
        x[i, [index[name] for name in o.features]] = 1
    return x
