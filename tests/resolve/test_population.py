"""The confidence model's population: what the dev sets' real servers showed, and how it is used."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from replay_sim.resolve.confidence import population
from replay_sim.resolve.confidence.features import FEATURES
from replay_sim.resolve.confidence.leaveoneout import Example, learn_from
from replay_sim.resolve.confidence.model import PRIOR
from replay_sim.resolve.confidence.population import Observed, prior, rows, write

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def reread() -> Iterator[None]:
    """Forget what was read of the population file before and after a test that swaps it."""
    population._file.cache_clear()
    population._prior.cache_clear()
    yield
    population._file.cache_clear()
    population._prior.cache_clear()


def test_the_shipped_population_is_what_the_dev_sets_real_servers_show() -> None:
    """Formed again from the committed recordings and probes, the rows are the shipped ones: a change
    to the features or the resolver that would make them stale fails here."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "fixtures" / "population.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    servers = {o.server for o in rows()}
    assert {"git", "memory", "sqlite", "calc", "duckdb", "python"} <= servers and len(servers) == 15


def test_a_server_left_out_is_left_out_of_the_population() -> None:
    whole = prior()
    total = sum(o.right + o.wrong for o in rows())
    sqlite = sum(o.right + o.wrong for o in rows() if o.server == "sqlite")
    assert whole.source == "population" and whole.examples == total and sqlite > 0
    without = prior(frozenset({"sqlite"}))
    assert without.examples == total - sqlite
    assert without.weights != whole.weights
    # A store with no examples of its own is given the population's model, less the scored server.
    assert learn_from([], leave_out=frozenset({"sqlite"})) is without


def test_a_stores_fit_keeps_the_populations_base_and_moves_only_the_features_it_shows() -> None:
    """A store's examples never include an exact repeat from its own state, so the base is the
    population's; a feature the store shows often wrong is learned lower."""
    nearest = [f.name for f in FEATURES].index("nearest")
    x = np.zeros(len(FEATURES))
    x[nearest] = 1
    found = [Example("srv", "t", i, "nearest", False, x, i % 10 == 0) for i in range(300)]
    model = learn_from(found)
    assert model.bias == prior().bias
    assert model.weights[nearest] < prior().weights[nearest]


def test_a_population_of_another_feature_set_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reread: None
) -> None:
    path = tmp_path / "population.json"
    write([Observed("srv", ("nearest",), 1, 9)], path)
    monkeypatch.setattr(population, "POPULATION_FILE", path)
    assert rows() == (Observed("srv", ("nearest",), 1, 9),)
    assert prior().examples == 10
    data = json.loads(path.read_text())
    data["features"] = data["features"][:-1]  # written before a feature was added
    path.write_text(json.dumps(data))
    population._file.cache_clear()
    population._prior.cache_clear()
    assert rows() == () and prior() is PRIOR and population.summary() is None
