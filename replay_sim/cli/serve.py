"""Replay commands: ``serve`` (HTTP or stdio) and ``demo``.

What only one face or one option needs (the HTTP app and its admin API, the recorder side's
forwarding and sandboxes) is imported when it is used: a ``serve --stdio`` start waits for no more
than it serves with.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import click

from replay_sim.cli import Seconds, cli, db_option, match_config_option
from replay_sim.errors import ConfigError
from replay_sim.httpserver import DEFAULT_KEEP_ALIVE, LOG_LEVELS, HttpOptions
from replay_sim.listener import HostCheck, is_loopback
from replay_sim.record.config import DEFAULT_MAX_INSTANCES, DEFAULT_POOL
from replay_sim.replay.options import (
    DEFAULT_SANDBOX_CALL_LIMIT,
    DEFAULT_SANDBOX_IDLE,
    Limits,
    MissDetail,
    MissPolicyName,
)
from replay_sim.replay.shaping.faults import Faults, Latency

if TYPE_CHECKING:
    from replay_sim.record.config import RecorderConfig
    from replay_sim.redaction import Redactor
    from replay_sim.replay.core.replay import Replay
    from replay_sim.replay.stdio.start import Handover
    from replay_sim.resolve.calibration import MatchConfig

_LIMITS = Limits()  # the defaults
TOKEN_ENV = "REPLAY_SIM_TOKEN"


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
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Another Host name clients reach the server by (repeatable; IP addresses and localhost are "
    "always accepted; '*' turns the DNS-rebinding check off).",
)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    callback=lambda _ctx, _param, token: _admin_token(
        token if token is not None else os.environ.get(TOKEN_ENV)
    ),
    help="Bearer token the admin API and dashboard require (or env). Beyond loopback one is "
    "required; without it one is generated and printed.",
)
@click.option(
    "--session-idle-timeout",
    type=Seconds(0, min_open=True),
    default=_LIMITS.session_idle_timeout,
    show_default=True,
    help="Seconds after which a session that made no request is closed.",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(1),
    default=_LIMITS.max_sessions,
    show_default=True,
    help="Open sessions per recorded server; more are refused (503, Retry-After).",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(1),
    default=_LIMITS.max_concurrent,
    show_default=True,
    help="MCP requests in flight from which a request opening a session waits for its turn.",
)
@click.option(
    "--admission-wait",
    type=Seconds(0),
    default=_LIMITS.admission_wait,
    show_default=True,
    help="Seconds a request opening a session waits for its turn past --max-concurrent; then 503 "
    "with Retry-After (0: refused at once).",
)
@click.option(
    "--body-timeout",
    type=Seconds(0, min_open=True),
    default=_LIMITS.body_timeout,
    show_default=True,
    help="Seconds a client has to send a request's headers, and again its body (then 408 and the "
    "connection closed).",
)
@click.option(
    "--keep-alive",
    type=Seconds(0, min_open=True),
    default=DEFAULT_KEEP_ALIVE,
    show_default=True,
    help="Seconds an idle HTTP connection is kept open (past every common client's keep-alive, so a "
    "client never reuses a connection the server is closing).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="warning",
    show_default=True,
    help="uvicorn's log level (stderr).",
)
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="One log line per HTTP request on stdout (off: a trainer's rollouts make thousands).",
)
@click.option(
    "--max-episodes",
    type=click.IntRange(1),
    default=_LIMITS.max_episodes,
    show_default=True,
    help="Live episodes at most; a new one past it is refused (503), none is evicted.",
)
@click.option(
    "--episode-idle-timeout",
    type=Seconds(0, min_open=True),
    default=_LIMITS.episode_idle_timeout,
    show_default=True,
    help="Seconds after which an episode that made no request expires (its state freed).",
)
@click.option(
    "--episode-rate",
    type=Seconds(0, min_open=True),
    default=_LIMITS.episode_rate,
    show_default=True,
    help="New episodes a second, sustained, past a burst of --episode-burst (more: 503, retry).",
)
@click.option(
    "--episode-burst",
    type=click.IntRange(1),
    default=_LIMITS.episode_burst,
    show_default=True,
    help="New episodes that may be created at once (a batch of rollouts starting).",
)
@click.option(
    "--latency",
    default="none",
    show_default=True,
    metavar="none|recorded|fixed:MS|scale:F",
    help="Hold each answer: not at all, as long as its recording took, MS milliseconds, or F times "
    "the recorded time.",
)
@click.option(
    "--faults",
    "fault_specs",
    multiple=True,
    metavar="[SERVER/TOOL=]RATE[:KIND,...]|FILE.toml",
    help="Fail this share of tool calls on purpose, deterministically per episode (repeatable; kinds: "
    "timeout, error, is_error, disconnect; a TOML file's [faults] table, e.g. the matching config's).",
)
@click.option(
    "--fault-hold",
    type=Seconds(0, 3600),
    default=None,
    help="Seconds a timeout fault holds the answer before its timeout error  [default: 30]",
)
@click.option(
    "--miss",
    type=click.Choice([p.value for p in MissPolicyName]),
    default=MissPolicyName.ERROR.value,
    show_default=True,
    help="What to answer when no recording matches.",
)
@click.option(
    "--miss-detail",
    type=click.Choice([d.value for d in MissDetail]),
    default=MissDetail.FULL.value,
    show_default=True,
    help="How much a miss tells the client: the nearest recordings and their differing arguments "
    "(full), the reason without argument values (reason: nothing a policy in training can copy), or "
    "only that no recording matches (none).",
)
@click.option(
    "--strict", is_flag=True, help="Refuse to start when a listing the servers advertise is missing."
)
@click.option("--stdio", is_flag=True, help="Serve one recorded server over stdin/stdout (needs --server).")
@click.option("--server", "server_name", help="The recorded server to serve over stdio.")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Recorder config: the real servers (--miss live, sandbox) and the redaction rules recorded with.",
)
@click.option(
    "--llm-url", envvar="REPLAY_SIM_LLM_URL", help="OpenAI-compatible API base URL (--miss synthesize)."
)
@click.option("--llm-model", envvar="REPLAY_SIM_LLM_MODEL", help="Model for --llm-url.")
@click.option("--llm-api-key", envvar="REPLAY_SIM_LLM_API_KEY", help="Bearer token for --llm-url (or env).")
@click.option(
    "--sandbox-pool",
    type=click.IntRange(0),
    default=DEFAULT_POOL,
    show_default=True,
    help="--miss sandbox: started instances kept ready per sandbox server.",
)
@click.option(
    "--max-sandboxes",
    type=click.IntRange(1),
    default=DEFAULT_MAX_INSTANCES,
    show_default=True,
    help="--miss sandbox: live instances at most, across servers; past it the least recently used idle "
    "one is given back (its episode rebuilds it), and a call waits only while all are busy answering.",
)
@click.option(
    "--sandbox-timeout",
    type=Seconds(0, min_open=True),
    default=30.0,
    show_default=True,
    help="--miss sandbox: seconds a call may wait for an instance before it is a miss saying why.",
)
@click.option(
    "--sandbox-idle",
    type=Seconds(0, min_open=True),
    default=DEFAULT_SANDBOX_IDLE,
    show_default=True,
    help="--miss sandbox: seconds without a call after which an episode's instance is given back "
    "(the episode's next call rebuilds its state on a fresh one).",
)
@click.option(
    "--sandbox-call-limit",
    type=Seconds(0, min_open=True),
    default=DEFAULT_SANDBOX_CALL_LIMIT,
    show_default=True,
    help="--miss sandbox: seconds one call to an instance may take at most, progress notifications "
    "or not; past it the instance is ended and the call is a miss.",
)
@click.option("--index-dir", type=click.Path(file_okay=False, path_type=Path), help="Vector index folder.")
@match_config_option
@click.option(
    "--ray", "on_ray", is_flag=True, help="Serve --snapshot from replicas on Ray Serve (pip extra 'ray')."
)
@click.option(
    "--replicas", type=click.IntRange(1), default=2, show_default=True, help="Ray: replay replicas."
)
@click.option(
    "--max-ongoing-requests",
    type=click.IntRange(1),
    default=256,
    show_default=True,
    help="Ray: requests one replica works on at once (more wait for that replica).",
)
@click.option("--autoscale-min", type=click.IntRange(1), help="Ray: autoscale between this many replicas…")
@click.option("--autoscale-max", type=click.IntRange(1), help="Ray: …and this many.")
@click.option(
    "--ray-address", help="Ray: a running cluster to deploy on (auto, HOST:PORT); default a local Ray."
)
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
    index_dir: Path | None,
    match_config: MatchConfig | None,
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
            keep_alive=keep_alive,
            config=None if config is None else str(config),
            sandbox_pool=sandbox_pool,
            max_sandboxes=max_sandboxes,
            limits=limits,
        )

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
    if stdio and plain and not (snapshot or config or fault_specs or strict or match_config):
        assert server_name is not None
        started = _start_stdio(db, index_dir, server_name)
        if started is not None and started.ended:
            return
    recorder_config = None
    if config is not None:
        from replay_sim.record.config import load_config

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
        from replay_sim.cli.sandboxes import sandbox_pool as build_sandbox_pool

        sandboxes = build_sandbox_pool(
            recorder_config, pool=sandbox_pool, max_instances=max_sandboxes, servers=servers
        )
    from replay_sim.replay.factory import open_replay  # the MCP SDK, the resolver

    replay = open_replay(
        db,
        snapshot=snapshot,
        miss=miss,
        redactor=None if recorder_config is None else _recorded_with(recorder_config),
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
        latency=Latency.parse(latency),
        faults=faults,
        miss_detail=miss_detail,
    )
    if snapshot is not None:  # verified by open_replay, or it refused
        click.echo(f"replay-sim: verified snapshot {snapshot}: serving {replay.snapshot}", err=True)
    for problem in replay.check(strict):
        click.echo(f"replay-sim: warning: {problem}", err=True)
    if stdio:
        assert server_name is not None
        replay.server(server_name)  # fail before taking over stdio
        anyio.run(_serve_stdio_until_signalled, replay, server_name, started)
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


async def _serve_stdio_until_signalled(replay: Replay, name: str, started: Handover | None) -> None:
    """Serve over stdio until the client hangs up, or SIGTERM/SIGHUP: then end as at hang-up
    (what the replay holds is closed, queued sandbox answers written) before exiting."""
    import signal

    from replay_sim.replay.stdio.serve import serve_stdio

    async with anyio.create_task_group() as tg:

        async def stop_when_signalled() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_when_signalled)
        await serve_stdio(replay, name, started)
        tg.cancel_scope.cancel()


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
        table.close()


def _admin_token(token: str | None) -> str | None:
    """:func:`replay_sim.replay.http.api.admin_token` (FastAPI's module: imported only for a token)."""
    if token is None:
        return None
    from replay_sim.replay.http.api import admin_token

    return admin_token(token)


def _listening(url: str) -> None:
    """The one line a script waits for (stdout): printed once the server is ready, never before."""
    click.echo(f"listening on {url}")
    sys.stdout.flush()


def _recorded_with(config: RecorderConfig) -> Redactor:
    """The config's redaction rules with every upstream's secret values, as the recorder applied them."""
    return config.redactor.with_secrets(
        secret for spec in config.servers.values() for secret in spec.secrets()
    )


@cli.command("demo")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--once", is_flag=True, help="Exit after the scripted client instead of serving on.")
def demo_command(host: str, port: int, once: bool) -> None:
    """Replay the shipped demo recordings and show an exact hit, a semantic hit and a miss."""
    from replay_sim.cli.demo import run_demo

    run_demo(host, port, once=once, echo=click.echo)
