"""Agent clients nobody here wrote, driving a replay through episode URLs.

Every test runs the same two interleaved stateful episodes (``clients_helpers.STEPS``) against the
counter store of ``replay_helpers.build_store`` (``counter`` is recorded as 0, then 1 after
``increment``): each episode must be answered from its own history, however many sessions its
client opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from replay_helpers import build_store

import replay_sim
from replay_sim import ReplayServer


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplayServer]:
    """The counter store served over HTTP in this process."""
    folder: Path = tmp_path_factory.mktemp("clients")
    build_store(folder / "replay.db").close()
    with replay_sim.serving(db=folder / "replay.db", index_dir=folder / "index") as served:
        yield served
