"""Replay commands: ``serve`` (HTTP or stdio) and ``demo``.

What only one face or one option needs (the HTTP app and its admin API, the recorder side's
forwarding and sandboxes) is imported when it is used: a ``serve --stdio`` start waits for no more
than it serves with.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import click

from replay_sim.cli import cli, naming_port_option
from replay_sim.cli.help import GroupedCommand
from replay_sim.cli.serve_options import SERVE_GROUPS, serve_options
from replay_sim.errors import ConfigError
from replay_sim.httpserver import HttpOptions
from replay_sim.listener import HostCheck, is_loopback
from replay_sim.replay.options import Limits, MissPolicyName
from replay_sim.replay.shaping.faults import Faults, Latency

if TYPE_CHECKING:
    from replay_sim.replay.stdio.start import Handover
    from replay_sim.resolve.calibration import MatchConfig


@cli.command("serve", cls=GroupedCommand, groups=SERVE_GROUPS)
@serve_options
def serve_command(
    db: Path,
    snapshot: Path | None,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    token: str | None,
    session_idle_timeout: float,
    max_sessions: int,
    max_concurrent: int,
    admission_wait: float,
    body_timeout: float,
    keep_alive: float,
    log_level: str,
    access_log: bool,
    max_episodes: int,
    episode_idle_timeout: float,
    episode_rate: float,
    episode_burst: int,
    episode_client_share: float,
    latency: str,
    fault_specs: tuple[str, ...],
    fault_hold: float | None,
    miss: str,
    miss_detail: str,
    strict: bool,
    stdio: bool,
    server_name: str | None,
    config: Path | None,
    llm_url: str | None,
    llm_model: str | None,
    llm_api_key: str | None,
    sandbox_pool: int,
    max_sandboxes: int,
    sandbox_timeout: float,
    sandbox_idle: float,
    sandbox_call_limit: float,
    sandbox_snapshots: int,
    sandbox_snapshot_mb: int,
    unconfined_sandboxes: bool,
    index_dir: Path | None,
    match_config: MatchConfig | None,
    min_confidence: float | None,
    on_ray: bool,
    replicas: int,
    max_ongoing_requests: int,
    autoscale_min: int | None,
    autoscale_max: int | None,
    ray_address: str | None,
) -> None:
    """Replay the recorded servers: /mcp/<server> over HTTP (plus admin API and dashboard), or stdio."""
    limits = Limits(  # each Ray replica's too
        session_idle_timeout=session_idle_timeout,
        max_sessions=max_sessions,
        max_concurrent=max_concurrent,
        admission_wait=admission_wait,
        body_timeout=body_timeout,
        max_episodes=max_episodes,
        episode_idle_timeout=episode_idle_timeout,
        episode_rate=episode_rate,
        episode_burst=episode_burst,
        episode_client_share=episode_client_share,
    )
    if on_ray:
        if snapshot is None or stdio:
            raise click.UsageError(
                "--ray serves a frozen snapshot over HTTP: give --snapshot PATH, not --stdio"
            )
        if index_dir is not None:
            raise click.UsageError(
                "--ray serves the snapshot with its own index, which its id covers: drop --index-dir"
            )
        if port == 0:  # Serve's proxy binds the port it is given on each node: 0 has no one answer
            raise click.UsageError(
                "--ray needs a fixed port (Ray Serve's HTTP proxy binds it on every node): give --port "
                "PORT, e.g. --port 8765"
            )
        from replay_sim.scale.deploy import ScaleSettings, run  # Ray is imported only here

        if token is None and not is_loopback(host):
            token = secrets.token_urlsafe(24)
            click.echo(f"the admin API needs 'Authorization: Bearer {token}' (generated)", err=True)
        settings = ScaleSettings(
            str(snapshot),
            replicas=replicas,
            max_ongoing_requests=max_ongoing_requests,
            autoscale_min=autoscale_min,
            autoscale_max=autoscale_max,
            host=host,
            port=port,
            allowed_hosts=allowed_hosts,
            token=token,
            miss=miss,
            miss_detail=miss_detail,
            min_confidence=min_confidence,
            keep_alive=keep_alive,
            config=None if config is None else str(config),
            sandbox_pool=sandbox_pool,
            max_sandboxes=max_sandboxes,
            sandbox_timeout=sandbox_timeout,
            sandbox_idle=sandbox_idle,
            sandbox_call_limit=sandbox_call_limit,
            unconfined_sandboxes=unconfined_sandboxes,
            sandbox_snapshots=sandbox_snapshots,
            sandbox_snapshot_mb=sandbox_snapshot_mb,
            limits=limits,
        )

        if unconfined_sandboxes and config is not None:
            _warn_unconfined()

        def ready(url: str) -> None:
            click.echo(
                f"replaying {snapshot} on Ray Serve at {url}/mcp/<server> ({replicas} replicas)", err=True
            )
            _listening(url)

        run(settings, address=ray_address, on_ready=ready)
        return
    if stdio and not server_name:
        raise click.UsageError("--stdio serves one server: name it with --server NAME")
    started = None
    # A start answers from the table only when nothing is to be checked or started first.
    plain = miss in (MissPolicyName.ERROR, MissPolicyName.NEAREST) and latency == "none"
    if (
        stdio
        and plain
        and not (snapshot or config or fault_specs or strict or match_config or min_confidence is not None)
    ):
        assert server_name is not None
        started = _start_stdio(db, index_dir, server_name)
        if started is not None and started.ended:
            return
    recorder_config = None
    if config is not None:
        from replay_sim.record.config_file import load_config

        recorder_config = load_config(config)
    faults = Faults.parse(fault_specs, hold=fault_hold)
    forward = None
    if miss == MissPolicyName.LIVE and snapshot is None:  # (a snapshot refuses --miss live itself)
        if recorder_config is None:
            raise ConfigError("--miss live needs --config FILE, the recorder config naming the real servers")
        from replay_sim.record.forward import Forwarder

        forward = Forwarder(recorder_config)
    if miss == MissPolicyName.SANDBOX and recorder_config is None:
        raise ConfigError("--miss sandbox needs --config FILE, the recorder config declaring sandbox servers")
    sandboxes = None
    own = [] if recorder_config is None else [n for n, s in recorder_config.servers.items() if s.miss]
    if recorder_config is not None and (miss == MissPolicyName.SANDBOX or own):
        # Every sandbox with --miss sandbox; else those whose config says miss = "sandbox".
        servers = None if miss == MissPolicyName.SANDBOX else own
        from replay_sim.record.instances.building import sandbox_pool as build_sandbox_pool
        from replay_sim.replay.policies.recording import sandbox_side_file
        from replay_sim.store.snapshot import STORE_FILE

        store = db if snapshot is None else snapshot / STORE_FILE  # its folder: hidden from instances
        hidden = [p for p in (index_dir, config, sandbox_side_file(store)) if p is not None]
        sandboxes = build_sandbox_pool(
            recorder_config, pool=sandbox_pool, max_instances=max_sandboxes, servers=servers,
            store=store, hidden=hidden,
            unconfined=unconfined_sandboxes, snapshots=sandbox_snapshots, snapshot_mb=sandbox_snapshot_mb,
        )  # fmt: skip
        if unconfined_sandboxes:
            _warn_unconfined()
    from replay_sim.replay.factory import open_replay  # the MCP SDK, the resolver

    replay = open_replay(
        db,
        snapshot=snapshot,
        miss=miss,
        redactor=None if recorder_config is None else recorder_config.recorded_redactor(),
        forward=forward,
        sandboxes=sandboxes,
        sandbox_timeout=sandbox_timeout,
        sandbox_idle=sandbox_idle,
        sandbox_call_limit=sandbox_call_limit,
        llm_url=llm_url,
        llm_model=llm_model,
        llm_api_key=llm_api_key,
        index_dir=index_dir,
        match_config=match_config,
        min_confidence=min_confidence,
        latency=Latency.parse(latency),
        faults=faults,
        miss_detail=miss_detail,
    )
    if sandboxes is not None and recorder_config is not None:
        from replay_sim.cli.sandboxes import check_sandboxes

        try:
            served = sandboxes.servers() & {server_name} if stdio else sandboxes.servers()
            check_sandboxes(recorder_config, served, replay.store)
        except ConfigError:
            replay.close()
            raise
    if snapshot is not None:  # verified by open_replay, or it refused
        click.echo(f"replay-sim: verified snapshot {snapshot}: serving {replay.snapshot}", err=True)
    for problem in replay.check(strict):
        click.echo(f"replay-sim: warning: {problem}", err=True)
    if stdio:
        assert server_name is not None
        replay.server(server_name)  # fail before taking over stdio
        from replay_sim.replay.stdio.serve import serve_stdio_until_signalled

        anyio.run(serve_stdio_until_signalled, replay, server_name, started)
        return

    generated = token is None and not is_loopback(host)
    if generated:
        token = secrets.token_urlsafe(24)

    def announce(url: str) -> None:
        for name in replay.names():
            click.echo(f"replaying {name} at {url}/mcp/{name}", err=True)
        click.echo(f"dashboard {url}/ · admin API {url}/docs", err=True)
        if token is not None:
            shown = token if generated else "<token>"
            click.echo(
                f"the admin API and dashboard need a token: 'Authorization: Bearer {shown}', "
                f"or open {url}/#token={shown}"
                + (" (generated; choose one with --token or REPLAY_SIM_TOKEN)" if generated else ""),
                err=True,
            )
        hosts = HostCheck(host, allowed_hosts).describe()
        click.echo(f"accepted Host names: {hosts} (more with --allowed-host NAME)", err=True)
        click.echo(f"episodes: {url}/episodes/<id>/mcp/<server> (POST {url}/api/episodes)", err=True)
        if latency != "none" or faults:
            said = f"faults {faults.describe()} (timeouts held {faults.hold:g} s)" if faults else "no faults"
            click.echo(f"injecting latency {latency} and {said}", err=True)

    options = HttpOptions(
        keep_alive=keep_alive, header_timeout=body_timeout, log_level=log_level, access_log=access_log
    )
    from replay_sim.replay.http.runner import serve  # the HTTP app: FastAPI, the admin API

    with naming_port_option():
        serve(
            replay,
            host,
            port,
            options=options,
            on_listening=announce,
            on_ready=_listening,
            allowed_hosts=allowed_hosts,
            token=token,
            limits=limits,
        )


def _start_stdio(db: Path, index_dir: Path | None, server: str) -> Handover | None:
    """Answer what the store's start table answers, before the replay is loaded (``--stdio``).

    Returns:
        Where the start left the connection, or None when there is no start table to use (why
        is said on stderr when it is stale).
    """
    from replay_sim.replay.stdio.start import StartTable, serve_until_needed
    from replay_sim.resolve.layout import DEFAULT_INDEX_DIR

    table, why = StartTable.open(db, index_dir or DEFAULT_INDEX_DIR, server)
    if why:
        click.echo(f"replay-sim: {why}", err=True)
    if table is None:
        return None
    try:
        return serve_until_needed(table)
    finally:
        if table.problem:
            click.echo(f"replay-sim: {table.problem}", err=True)
        table.close()


def _listening(url: str) -> None:
    """The one line a script waits for (stdout): printed once the server is ready, never before."""
    click.echo(f"listening on {url}")
    sys.stdout.flush()


def _warn_unconfined() -> None:
    """The banner line of ``--unconfined-sandboxes`` (``/api/ready`` and the dashboard say it too)."""
    click.echo("replay-sim: WARNING: sandbox instances run UNCONFINED (--unconfined-sandboxes): "
               "an episode's calls reach the host as this process", err=True)  # fmt: skip
