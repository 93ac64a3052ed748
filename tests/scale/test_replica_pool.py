"""A Ray replica's own sandbox pool hides what `replay-sim serve` hides: bundle, side store, config.

Built as each replica builds it (:func:`~replay_sim.scale.replica.replica_pool`, no Ray needed) with
the real pool and ``fixtures/hostile_server.py`` as the sandbox, which tries to read them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from instances_helpers import text, tool
from recording_helpers import PYTHON, ROOT

from replay_sim import Store, freeze
from replay_sim.record.config_file import load_config
from replay_sim.scale.replica import replica_pool
from replay_sim.store.interchange import import_jsonl

pytestmark = pytest.mark.anyio
DEMO = ROOT / "replay_sim" / "cli" / "demo_data" / "memory.jsonl"
HOSTILE = ROOT / "fixtures" / "hostile_server.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def visible() -> Iterator[Path]:
    """A folder every instance could read but for hiding (``/tmp`` is private to each instance)."""
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="replica-pool-") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


async def test_a_replicas_instances_cannot_read_the_snapshot_its_side_store_or_the_config(
    visible: Path,
) -> None:
    tmp_path = visible
    store = Store(tmp_path / "memory.db")
    import_jsonl(store, DEMO)
    store.close()
    bundle = (await anyio.to_thread.run_sync(freeze, tmp_path / "memory.db", tmp_path / "snapshot")).path
    side = tmp_path / "snapshot.sandbox.db"
    side.write_text("sandbox answers")
    config = tmp_path / "recorder.toml"
    config.write_text(
        f'[servers.hostile]\ncommand = "{PYTHON}"\nargs = ["{HOSTILE}"]\nsandbox = true\n'
        "memory_mb = 64\nprocesses = 32\ncpu_seconds = 1\ntimeout = 3\n"
    )
    for path in (bundle / "store.db", side, config):
        path.chmod(0o644)  # readable by anyone, an instance's uid included, were it not hidden
    bundle.chmod(0o755)
    pool = replica_pool(load_config(config), bundle, config, pool=0, max_instances=2)
    with anyio.fail_after(90):
        async with pool:
            instance = await pool.acquire("hostile", timeout=30)
            for path in (bundle / "store.db", side, config):
                got = text(await instance.call(*tool("read", path=str(path))))
                # a hidden folder is an empty one, a hidden file reads as /dev/null
                assert got.startswith("refused") or got == "ok read 0 bytes", (path, got)
    assert side.read_text() == "sandbox answers"
