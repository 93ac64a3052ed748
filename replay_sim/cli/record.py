"""``replay-sim record``: run the recording proxy in front of real MCP servers."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import anyio
import click

from replay_sim.cli import Seconds, cli, db_option
from replay_sim.errors import ConfigError
from replay_sim.httpserver import DEFAULT_KEEP_ALIVE, HttpOptions
from replay_sim.record.config import DEFAULT_TIMEOUT, RecorderConfig, UpstreamSpec
from replay_sim.record.config_file import load_config
from replay_sim.record.http import record_http
from replay_sim.record.isolation import check_recordable
from replay_sim.record.recorder import record_stdio
from replay_sim.redaction import Redactor


def _env(values: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise ConfigError(
                    f"--env {name}: not set in the recorder's environment (or pass {name}=VALUE)"
                )
            value = os.environ[name]
        env[name] = value
    return env


def _headers(values: tuple[str, ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"--header {item!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


_STOPPING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name))
"""Signals that stop the recorder the way Ctrl-C (SIGINT) does."""


@contextmanager
def _stops_as_sigint() -> Iterator[Callable[[], signal.Signals | None]]:
    """Let SIGTERM (``kill``, a supervisor, an MCP client closing its server), SIGHUP (a closed
    terminal or SSH session) and SIGQUIT stop the recorder the way Ctrl-C does: connections close
    and the store is closed, which checkpoints its WAL into the main file. Without this they end
    the process at once (the HTTP server re-raises SIGTERM after its own graceful shutdown),
    leaving every call in the ``-wal`` file, so a copy of the ``.db`` alone holds none.

    SIGINT is handled even when inherited as ignored (a script's background job, ``nohup``):
    asyncio cancels the main task on it only when Python's own handler is in place, so an ignored
    SIGINT would leave every other signal unable to stop the recorder.

    Yields:
        Which of those signals arrived first (None: none did).
    """
    received: list[signal.Signals] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signal.Signals(signum))
        signal.raise_signal(signal.SIGINT)  # asyncio cancels the main task: cleanup runs

    previous = {signum: signal.signal(signum, on_signal) for signum in _STOPPING}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield lambda: received[0] if received else None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--http {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]") or "127.0.0.1", int(port)


@cli.command("record", context_settings={"ignore_unknown_options": True})
@db_option
@click.option(
    "--name", help="Recorded server name (default: from the command or URL; with --config: the one to serve)."
)
@click.option(
    "--http", "http", metavar="HOST:PORT", help="Serve clients over streamable HTTP at /mcp/<name>."
)
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), help="TOML file of upstreams."
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="With --http: another Host name clients reach the recorder by (repeatable; '*' turns the "
    "DNS-rebinding check off).",
)
@click.option(
    "--keep-alive",
    type=Seconds(0, min_open=True),
    default=DEFAULT_KEEP_ALIVE,
    show_default=True,
    help="With --http: seconds an idle client connection is kept open (past every common client's "
    "keep-alive, so a client never reuses a connection the recorder is closing).",
)
@click.option("--url", help="Record a streamable HTTP upstream instead of a command.")
@click.option(
    "-e", "--env", "env", multiple=True, metavar="NAME[=VALUE]", help="Environment for the upstream."
)
@click.option(
    "-H", "--header", "header", multiple=True, metavar="'NAME: VALUE'", help="HTTP header for --url."
)
@click.option(
    "--cwd", type=click.Path(file_okay=False, path_type=Path), help="Working directory of the upstream."
)
@click.option(
    "--redact-key", multiple=True, metavar="GLOB", help="Extra object-key glob whose values are redacted."
)
@click.option("--redact-pattern", multiple=True, metavar="REGEX", help="Regex whose matches are redacted.")
@click.option(
    "--timeout",
    type=Seconds(min=0),
    help=f"Seconds to wait for one upstream answer, restarted by progress on it (default "
    f"{DEFAULT_TIMEOUT:g}; 0: no limit; overrides the config's). A request that times out is "
    "answered with an error naming the upstream, and not recorded.",
)
@click.option(
    "--explore",
    is_flag=True,
    help="Also ask the server which argument differences (case, whitespace, order) its read-only "
    "tools ignore, a few calls per tool, so replay can answer such variants.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record_command(
    db: Path,
    name: str | None,
    http: str | None,
    config_file: Path | None,
    allowed_hosts: tuple[str, ...],
    keep_alive: float,
    url: str | None,
    env: tuple[str, ...],
    header: tuple[str, ...],
    cwd: Path | None,
    redact_key: tuple[str, ...],
    redact_pattern: tuple[str, ...],
    timeout: float | None,
    explore: bool,
    command: tuple[str, ...],
) -> None:
    """Record real MCP servers while proxying a client to them.

    \b
    replay-sim record --name NAME [--db PATH] -- mcp-server-git --repository .
    replay-sim record --http 127.0.0.1:8765 --url http://127.0.0.1:9000/mcp
    replay-sim record --config server/record.example.toml --http 127.0.0.1:8765

    Without --http the proxy serves one client over stdin/stdout, so an MCP client config can
    launch it in place of the real server.
    """
    config = _config(config_file, name, url, env, header, cwd, timeout, command)
    if explore:
        servers = {n: dataclasses.replace(spec, explore=True) for n, spec in config.servers.items()}
        config = RecorderConfig(servers, config.redactor)
    extra_keys = tuple(redact_key)
    if extra_keys or redact_pattern:
        base = config.redactor
        config = RecorderConfig(
            config.servers,
            Redactor(
                key_globs=(*base.key_globs, *extra_keys),
                patterns=(*base.patterns, *redact_pattern),
                replacement=base.replacement,
            ),
        )
    recorded = config.servers if http is not None else {n: s for n, s in config.servers.items() if n == name}
    for server_name, server_spec in (recorded or config.servers).items():
        check_recordable(server_name, server_spec)
    if http is not None:
        host, port = _address(http)

        def ready(base_url: str) -> None:
            for server in config.servers:
                click.echo(f"replay-sim: recording {server} into {db} at {base_url}/mcp/{server}", err=True)
            click.echo(f"listening on {base_url}")  # the one line a script waits for: ready now
            sys.stdout.flush()

        _run_until_stopped(
            db,
            lambda: record_http(
                config.servers,
                store=db,
                host=host,
                port=port,
                redactor=config.redactor,
                on_ready=ready,
                allowed_hosts=allowed_hosts,
                options=HttpOptions(keep_alive=keep_alive),
            ),
        )
        return
    if len(config.servers) != 1 and name not in config.servers:
        raise ConfigError(
            f"{config_file}: {len(config.servers)} upstreams; serve them with --http HOST:PORT, "
            f"or pick one for stdio with --name ({', '.join(config.servers)})"
        )
    server = name if name in config.servers else next(iter(config.servers))
    click.echo(f"replay-sim: recording {server} into {db} (stdio)", err=True)
    spec = config.servers[server]
    _run_until_stopped(db, lambda: record_stdio(spec, store=db, name=server, redactor=config.redactor))


def _run_until_stopped(db: Path, main: Callable[[], Awaitable[None]]) -> None:
    """Run the recorder; SIGTERM, SIGHUP or SIGQUIT stops it cleanly (exit status 0), as the client
    hanging up does, and SIGINT too (exit status 130): the store is checkpointed either way."""
    with _stops_as_sigint() as stopped_by:
        try:
            anyio.run(main)
        except KeyboardInterrupt:
            stopping = stopped_by()
            if stopping is None:
                raise
            click.echo(f"replay-sim: stopped ({stopping.name}); recordings saved in {db}", err=True)


def _config(
    config_file: Path | None,
    name: str | None,
    url: str | None,
    env: tuple[str, ...],
    header: tuple[str, ...],
    cwd: Path | None,
    timeout: float | None,
    command: tuple[str, ...],
) -> RecorderConfig:
    if config_file is not None:
        if command or url:
            raise ConfigError("give either --config FILE or an upstream (-- COMMAND... or --url), not both")
        config = load_config(config_file)
        if timeout is None:
            return config
        servers = {n: dataclasses.replace(s, timeout=timeout or None) for n, s in config.servers.items()}
        return RecorderConfig(servers, config.redactor)  # --timeout overrides the file's
    if bool(command) == bool(url):
        raise ConfigError("nothing to record: give -- COMMAND ARGS..., --url URL, or --config FILE")
    limit = DEFAULT_TIMEOUT if timeout is None else (timeout or None)  # 0: no limit
    if url is not None:
        spec = UpstreamSpec(url=url, headers=_headers(header), timeout=limit)
    else:
        spec = UpstreamSpec(
            command=command[0],
            args=tuple(command[1:]),
            env=_env(env),
            cwd=str(cwd) if cwd else None,
            timeout=limit,
        )
    return RecorderConfig({name or spec.default_name(): spec})  # the default redaction rules
