"""Replay commands: ``serve`` (HTTP or stdio) and ``demo``."""

from __future__ import annotations

from pathlib import Path

import anyio
import click

from replay_sim.cli import cli, db_option, match_config_option
from replay_sim.replay.admin import open_replay, serve
from replay_sim.replay.miss import MissPolicyName
from replay_sim.resolve.calibration import MatchConfig


@cli.command("serve")
@db_option
@click.option(
    "--snapshot",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Serve a frozen snapshot bundle (verified first) instead of --db.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option(
    "--miss",
    type=click.Choice([p.value for p in MissPolicyName]),
    default=MissPolicyName.ERROR.value,
    show_default=True,
    help="What to answer when no recording matches.",
)
@click.option(
    "--strict", is_flag=True, help="Refuse to start when a listing the servers advertise is missing."
)
@click.option("--stdio", is_flag=True, help="Serve one recorded server over stdin/stdout (needs --server).")
@click.option("--server", "server_name", help="The recorded server to serve over stdio.")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Recorder config: the real servers (for --miss live) and the redaction rules recorded with.",
)
@click.option(
    "--llm-url", envvar="REPLAY_SIM_LLM_URL", help="OpenAI-compatible API base URL (--miss synthesize)."
)
@click.option("--llm-model", envvar="REPLAY_SIM_LLM_MODEL", help="Model for --llm-url.")
@click.option("--llm-api-key", envvar="REPLAY_SIM_LLM_API_KEY", help="Bearer token for --llm-url (or env).")
@click.option("--index-dir", type=click.Path(file_okay=False, path_type=Path), help="Vector index folder.")
@match_config_option
def serve_command(
    db: Path,
    snapshot: Path | None,
    host: str,
    port: int,
    miss: str,
    strict: bool,
    stdio: bool,
    server_name: str | None,
    config: Path | None,
    llm_url: str | None,
    llm_model: str | None,
    llm_api_key: str | None,
    index_dir: Path | None,
    match_config: MatchConfig | None,
) -> None:
    """Replay the recorded servers: /mcp/<server> over HTTP (plus admin API and dashboard), or stdio."""
    if stdio and not server_name:
        raise click.UsageError("--stdio serves one server: name it with --server NAME")
    if snapshot is None and not db.is_file():
        raise click.ClickException(f"{db}: no such recording store; record or import first (or pass --db)")
    replay = open_replay(
        db,
        snapshot=snapshot,
        miss=miss,
        config=config,
        llm_url=llm_url,
        llm_model=llm_model,
        llm_api_key=llm_api_key,
        index_dir=index_dir,
        match_config=match_config,
    )
    for problem in replay.check(strict):
        click.echo(f"replay-sim: warning: {problem}", err=True)
    if stdio:
        assert server_name is not None
        replay.server(server_name)  # fail before taking over stdio
        anyio.run(replay.serve_stdio, server_name)
        return

    def announce(url: str) -> None:
        for name in replay.names():
            click.echo(f"replaying {name} at {url}/mcp/{name}", err=True)
        click.echo(f"dashboard {url}/ · admin API {url}/docs", err=True)

    serve(replay, host, port, on_ready=announce)


@cli.command("demo")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--once", is_flag=True, help="Exit after the scripted client instead of serving on.")
def demo_command(host: str, port: int, once: bool) -> None:
    """Replay the shipped demo recordings and show an exact hit, a semantic hit and a miss."""
    from replay_sim.cli.demo import run_demo

    run_demo(host, port, once=once, echo=click.echo)
