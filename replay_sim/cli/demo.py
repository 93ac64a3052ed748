"""``replay-sim demo``: replay the shipped recordings and show the three kinds of answer.

The recordings in ``replay_sim/cli/demo_data/*.jsonl`` (a real session with the npm reference server
``server-memory``) are imported into a temporary store and served over HTTP; a scripted MCP
client then makes an exact call, a reworded one the semantic tier answers, and one no recording
answers — printing the provenance and, for the miss, its diagnostics.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import click
from mcp import Client

from replay_sim.cli import cli, naming_port_option
from replay_sim.errors import ConfigError
from replay_sim.listener import serving_in_thread
from replay_sim.protocol import MATCH_META_KEY
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.store.interchange import import_jsonl

__all__ = ["DEMO_FIXTURES", "SCRIPT", "demo_command", "import_demo", "run_demo", "run_script"]

DEMO_FIXTURES = Path(__file__).resolve().parent / "demo_data"
EPISODE = "demo-episode"
SCRIPT: list[tuple[str, str, dict[str, Any]]] = [
    ("exact hit: the recorded session, call for call", "read_graph", {}),
    ("", "create_entities", {}),  # arguments filled from the recording
    ("", "create_relations", {}),
    ("exact hit", "search_nodes", {"query": "Ada Lovelace"}),
    ("semantic hit: not recorded verbatim, same meaning", "search_nodes", {"query": "ada lovelace"}),
    ("miss: nothing recorded comes close enough", "search_nodes", {"query": "quantum chromodynamics"}),
]


def import_demo(db: Path, fixtures: Path = DEMO_FIXTURES) -> Store:
    """Import every ``*.jsonl`` demo fixture into a new store at ``db``.

    Raises:
        ConfigError: The fixture folder has no recordings.
    """
    files = sorted(fixtures.glob("*.jsonl"))
    if not files:
        raise ConfigError(f"{fixtures}: no demo recordings (*.jsonl); is this a source checkout?")
    store = Store(db)
    for file in files:
        import_jsonl(store, file)
    return store


def _recorded_arguments(store: Store, tool: str) -> dict[str, Any]:
    found = store.recordings("memory", method="tools/call", name=tool, limit=1)
    return found[0].arguments if found else {}


async def run_script(url: str, store: Store, echo: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """Run the scripted client against a replay server at ``url``; returns the provenance of each call."""
    seen: list[dict[str, Any]] = []
    async with Client(url, mode="legacy") as client:
        echo(f"connected to {url}: {client.server_info.name if client.server_info else '?'}")
        tools = await client.list_tools()
        echo(f"tools/list: {', '.join(t.name for t in tools.tools)}")
        for title, tool, arguments in SCRIPT:
            arguments = arguments or _recorded_arguments(store, tool)
            meta: Any = {"replay-sim/episode": EPISODE}  # shares history with other sessions of the episode
            result = await client.call_tool(tool, arguments, meta=meta)
            match = (result.meta or {}).get(MATCH_META_KEY, {})
            seen.append(match)
            if title:
                echo(f"\n== {title}")
            shown = json.dumps(arguments, ensure_ascii=False)[:70]
            status, score, recording = match.get("status"), match.get("score"), match.get("recording")
            source = f", recording #{recording}" if recording is not None else ""
            echo(f"{tool} {shown} -> {status} (score {score}{source})")
            for diff in match.get("differences", []):
                field, recorded, requested = diff["field"], diff["recorded"], diff["requested"]
                echo(f"   differs in {field}: recorded {recorded!r}, requested {requested!r}")
            if match.get("status") == "miss":
                text = "".join(getattr(c, "text", "") for c in result.content)
                echo("   " + text.replace("\n", "\n   "))
    return seen


def run_demo(
    host: str = "127.0.0.1", port: int = 8765, *, once: bool = False, echo: Callable[[str], Any] = print
) -> None:
    """Serve the demo recordings, run the scripted client, then keep serving unless ``once``.

    Args:
        host: Interface to bind.
        port: TCP port (0 picks a free one).
        once: Stop after the scripted client.
        echo: Where to print.
    """
    with tempfile.TemporaryDirectory(prefix="replay-sim-demo-") as tmp:
        store = import_demo(Path(tmp) / "demo.db")
        config_file = DEMO_FIXTURES / "replay-sim.toml"
        config = MatchConfig.load(config_file) if config_file.is_file() else None
        replay = Replay(store, resolver=Resolver(store, config=config, index_dir=Path(tmp) / "index"))
        try:
            with serving_in_thread(create_app(replay, host=host), host, port) as base:
                echo(f"replaying {', '.join(replay.names())} from {DEMO_FIXTURES} at {base}/mcp/<server>")
                anyio.run(run_script, f"{base}/mcp/memory", store, echo)
                if once:
                    return
                echo(f"\ndashboard {base}/ · admin API {base}/docs · Ctrl-C to stop")
                threading.Event().wait()  # serve until Ctrl-C
        except KeyboardInterrupt:
            pass
        finally:
            store.close()


@cli.command("demo")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help="TCP port  [default: 8765; with --once, a free one]",
)
@click.option("--once", is_flag=True, help="Exit after the scripted client instead of serving on.")
def demo_command(host: str, port: int | None, once: bool) -> None:
    """Replay the shipped demo recordings and show an exact hit, a semantic hit and a miss."""
    if port is None:
        port = 0 if once else 8765  # `demo --once` (make demo) needs no fixed port
    with naming_port_option():
        run_demo(host, port, once=once, echo=click.echo)
