"""The options of ``replay-sim serve``, and how ``serve --help`` groups them by concern.

``serve`` takes many options (46); its ``--help`` lists them in groups (:data:`SERVE_GROUPS`, drawn
by :class:`~replay_sim.cli.help.GroupedCommand`) so a reader finds the serving address, the miss
policy, the episode bounds, the limits and the logging apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from replay_sim.cli import Seconds, db_option, match_config_option
from replay_sim.httpserver import DEFAULT_KEEP_ALIVE, LOG_LEVELS
from replay_sim.record.config import (
    DEFAULT_MAX_INSTANCES,
    DEFAULT_POOL,
    DEFAULT_SNAPSHOT_MB,
    DEFAULT_SNAPSHOTS,
)
from replay_sim.replay.options import (
    DEFAULT_SANDBOX_CALL_LIMIT,
    DEFAULT_SANDBOX_IDLE,
    Limits,
    MissDetail,
    MissPolicyName,
)

__all__ = ["SERVE_GROUPS", "SERVE_OPTIONS", "TOKEN_ENV", "serve_options"]

_LIMITS = Limits()  # the defaults
TOKEN_ENV = "REPLAY_SIM_TOKEN"
F = TypeVar("F", bound=Callable[..., Any])


def _admin_token(token: str | None) -> str | None:
    """:func:`replay_sim.replay.http.api.admin_token` (FastAPI's module: imported only for a token)."""
    if token is None:
        return None
    from replay_sim.replay.http.api import admin_token

    return admin_token(token)


SERVE_OPTIONS: list[Callable[[Any], Any]] = [
    db_option,
    click.option(
        "--snapshot",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="Serve a frozen snapshot bundle (verified first) instead of --db.",
    ),
    click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind."),
    click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="TCP port."),
    click.option(
        "--allowed-host",
        "allowed_hosts",
        multiple=True,
        metavar="NAME",
        help="Another Host name clients reach the server by (repeatable; IP addresses and localhost are "
        "always accepted; '*' turns the DNS-rebinding check off).",
    ),
    click.option(
        "--token",
        envvar=TOKEN_ENV,
        callback=lambda _ctx, _param, token: _admin_token(
            token if token is not None else os.environ.get(TOKEN_ENV)
        ),
        help="Bearer token the admin API and dashboard require (or env). Beyond loopback one is "
        "required; without it one is generated and printed.",
    ),
    click.option(
        "--session-idle-timeout",
        type=Seconds(0, min_open=True),
        default=_LIMITS.session_idle_timeout,
        show_default=True,
        help="Seconds after which a session that made no request is closed.",
    ),
    click.option(
        "--max-sessions",
        type=click.IntRange(1),
        default=_LIMITS.max_sessions,
        show_default=True,
        help="Open sessions per recorded server; more are refused (503, Retry-After).",
    ),
    click.option(
        "--max-concurrent",
        type=click.IntRange(1),
        default=_LIMITS.max_concurrent,
        show_default=True,
        help="MCP requests in flight from which a request opening a session waits for its turn.",
    ),
    click.option(
        "--admission-wait",
        type=Seconds(0),
        default=_LIMITS.admission_wait,
        show_default=True,
        help="Seconds a request opening a session waits for its turn past --max-concurrent; then 503 "
        "with Retry-After (0: refused at once).",
    ),
    click.option(
        "--body-timeout",
        type=Seconds(0, min_open=True),
        default=_LIMITS.body_timeout,
        show_default=True,
        help="Seconds a client has to send a request's headers, and again its body (then 408 and the "
        "connection closed).",
    ),
    click.option(
        "--keep-alive",
        type=Seconds(0, min_open=True),
        default=DEFAULT_KEEP_ALIVE,
        show_default=True,
        help="Seconds an idle HTTP connection is kept open (past every common client's keep-alive, so a "
        "client never reuses a connection the server is closing).",
    ),
    click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS),
        default="warning",
        show_default=True,
        help="uvicorn's log level (stderr).",
    ),
    click.option(
        "--access-log/--no-access-log",
        default=False,
        show_default=True,
        help="One log line per HTTP request on stdout (off: a trainer's rollouts make thousands).",
    ),
    click.option(
        "--max-episodes",
        type=click.IntRange(1),
        default=_LIMITS.max_episodes,
        show_default=True,
        help="Live episodes at most; a new one past it is refused (503), none is evicted.",
    ),
    click.option(
        "--episode-idle-timeout",
        type=Seconds(0, min_open=True),
        default=_LIMITS.episode_idle_timeout,
        show_default=True,
        help="Seconds after which an episode that made no request expires (its state freed).",
    ),
    click.option(
        "--episode-rate",
        type=Seconds(0, min_open=True),
        default=_LIMITS.episode_rate,
        show_default=True,
        help="New episodes a second, sustained, past a burst of --episode-burst (more: 503, retry).",
    ),
    click.option(
        "--episode-burst",
        type=click.IntRange(1),
        default=_LIMITS.episode_burst,
        show_default=True,
        help="New episodes that may be created at once (a batch of rollouts starting).",
    ),
    click.option(
        "--episode-client-share",
        type=click.FloatRange(0, 1, min_open=True),
        default=_LIMITS.episode_client_share,
        show_default=True,
        help="The part of --episode-rate and --episode-burst one client address may take (1: all).",
    ),
    click.option(
        "--latency",
        default="none",
        show_default=True,
        metavar="none|recorded|fixed:MS|scale:F",
        help="Hold each answer: not at all, as long as its recording took, MS milliseconds, or F times "
        "the recorded time.",
    ),
    click.option(
        "--faults",
        "fault_specs",
        multiple=True,
        metavar="[SERVER/TOOL=]RATE[:KIND,...]|FILE.toml",
        help="Fail this share of tool calls on purpose, deterministically per episode (repeatable; kinds: "
        "timeout, error, is_error, disconnect; a TOML file's [faults] table, e.g. the matching config's).",
    ),
    click.option(
        "--fault-hold",
        type=Seconds(0, 3600),
        default=None,
        help="Seconds a timeout fault holds the answer before its timeout error  [default: 30]",
    ),
    click.option(
        "--miss",
        type=click.Choice([p.value for p in MissPolicyName]),
        default=MissPolicyName.ERROR.value,
        show_default=True,
        help="What to answer when no recording matches.",
    ),
    click.option(
        "--miss-detail",
        type=click.Choice([d.value for d in MissDetail]),
        default=MissDetail.FULL.value,
        show_default=True,
        help="How much a miss tells the client: the nearest recordings and their differing arguments "
        "(full), the reason without argument values (reason: nothing a policy in training can copy), or "
        "only that no recording matches (none).",
    ),
    click.option(
        "--strict", is_flag=True, help="Refuse to start when a listing the servers advertise is missing."
    ),
    click.option(
        "--stdio", is_flag=True, help="Serve one recorded server over stdin/stdout (needs --server)."
    ),
    click.option("--server", "server_name", help="The recorded server to serve over stdio."),
    click.option(
        "--config",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Recorder config: the real servers (--miss live, sandbox) and the redaction rules "
        "recorded with.",
    ),
    click.option(
        "--llm-url", envvar="REPLAY_SIM_LLM_URL", help="OpenAI-compatible API base URL (--miss synthesize)."
    ),
    click.option("--llm-model", envvar="REPLAY_SIM_LLM_MODEL", help="Model for --llm-url."),
    click.option(
        "--llm-api-key", envvar="REPLAY_SIM_LLM_API_KEY", help="Bearer token for --llm-url (or env)."
    ),
    click.option(
        "--sandbox-pool",
        type=click.IntRange(0),
        default=DEFAULT_POOL,
        show_default=True,
        help="--miss sandbox: started instances kept ready per sandbox server.",
    ),
    click.option(
        "--max-sandboxes",
        type=click.IntRange(1),
        default=DEFAULT_MAX_INSTANCES,
        show_default=True,
        help="--miss sandbox: live instances at most, across servers; past it the least recently used "
        "idle one is given back (its episode rebuilds it), and a call waits only while all are busy.",
    ),
    click.option(
        "--sandbox-timeout",
        type=Seconds(0, min_open=True),
        default=30.0,
        show_default=True,
        help="--miss sandbox: seconds a call may wait for an instance before it is a miss saying why.",
    ),
    click.option(
        "--sandbox-idle",
        type=Seconds(0, min_open=True),
        default=DEFAULT_SANDBOX_IDLE,
        show_default=True,
        help="--miss sandbox: seconds without a call after which an episode's instance is given back "
        "(the episode's next call rebuilds its state on a fresh one).",
    ),
    click.option(
        "--sandbox-call-limit",
        type=Seconds(0, min_open=True),
        default=DEFAULT_SANDBOX_CALL_LIMIT,
        show_default=True,
        help="--miss sandbox: seconds one call to an instance may take at most, progress notifications "
        "or not; past it the instance is ended and the call is a miss.",
    ),
    click.option(
        "--sandbox-snapshots",
        type=click.IntRange(0),
        default=DEFAULT_SNAPSHOTS,
        show_default=True,
        help="--miss sandbox: state snapshots kept at most (an instance's files at a state, to start "
        "later instances there instead of re-playing; least recently used evicted first; 0: none).",
    ),
    click.option(
        "--sandbox-snapshot-mb",
        type=click.IntRange(1),
        default=DEFAULT_SNAPSHOT_MB,
        show_default=True,
        help="--miss sandbox: megabytes of state snapshots kept at most.",
    ),
    click.option(
        "--unconfined-sandboxes",
        is_flag=True,
        help="--miss sandbox: run instances without containment (no namespaces, copy-on-write layer, "
        "unprivileged uid or limits) where the kernel refuses them; shown in the banner, /api/ready "
        "and the dashboard.",
    ),
    click.option(
        "--index-dir", type=click.Path(file_okay=False, path_type=Path), help="Vector index folder."
    ),
    match_config_option,
    click.option(
        "--min-confidence",
        type=click.FloatRange(0.0, 1.0),
        default=None,
        help="Operating point: serve an answer when its learned confidence reaches P, else run the miss "
        "policy (default: the strict tiers alone).",
    ),
    click.option(
        "--ray", "on_ray", is_flag=True, help="Serve --snapshot from replicas on Ray Serve (pip extra 'ray')."
    ),
    click.option(
        "--replicas", type=click.IntRange(1), default=2, show_default=True, help="Ray: replay replicas."
    ),
    click.option(
        "--max-ongoing-requests",
        type=click.IntRange(1),
        default=256,
        show_default=True,
        help="Ray: requests one replica works on at once (more wait for that replica).",
    ),
    click.option(
        "--autoscale-min", type=click.IntRange(1), help="Ray: autoscale between this many replicas…"
    ),
    click.option("--autoscale-max", type=click.IntRange(1), help="Ray: …and this many."),
    click.option(
        "--ray-address", help="Ray: a running cluster to deploy on (auto, HOST:PORT); default a local Ray."
    ),
]
"""Every option of ``serve``, in the order ``--help`` lists them within their groups."""

SERVE_GROUPS: dict[str, tuple[str, ...]] = {
    "Serving": ("db", "snapshot", "host", "port", "allowed_hosts", "token", "stdio", "server_name",
                "index_dir", "match_config", "strict"),
    "Misses and sandboxes": ("miss", "miss_detail", "min_confidence", "config", "llm_url", "llm_model",
                             "llm_api_key", "sandbox_pool", "max_sandboxes", "sandbox_timeout",
                             "sandbox_idle", "sandbox_call_limit", "sandbox_snapshots", "sandbox_snapshot_mb",
                             "unconfined_sandboxes"),
    "Episodes, latency and faults": ("max_episodes", "episode_idle_timeout", "episode_rate",
                                     "episode_burst", "episode_client_share", "latency", "fault_specs",
                                     "fault_hold"),
    "Limits": ("session_idle_timeout", "max_sessions", "max_concurrent", "admission_wait",
               "body_timeout", "keep_alive"),
    "Observability": ("log_level", "access_log"),
    "Scaling out on Ray Serve": ("on_ray", "replicas", "max_ongoing_requests", "autoscale_min",
                                 "autoscale_max", "ray_address"),
}  # fmt: skip
"""``serve --help``'s groups: each title and the options (parameter names) under it."""


def serve_options(command: F) -> F:
    """Declare every option of ``serve`` on ``command`` (as a stack of ``@click.option`` would)."""
    for option in reversed(SERVE_OPTIONS):
        command = option(command)
    return command
