"""A pool's refusals: a config it cannot serve, and why no sandbox instance could be had (what to change)."""

from __future__ import annotations

from collections.abc import Iterable

from replay_sim.errors import ConfigError
from replay_sim.record.config import RecorderConfig, UpstreamSpec

__all__ = ["served", "why_unavailable"]


def served(
    config: RecorderConfig,
    servers: Iterable[str] | None,
    pool: int,
    max_instances: int,
    idle_timeout: float | None,
) -> dict[str, UpstreamSpec]:
    """The sandbox servers a pool serves (``servers``, default all), once its counts are checked.

    Raises:
        ConfigError: A named server is not a sandbox of the config, or a count is out of range.
    """
    sandboxes = {name: spec for name, spec in config.servers.items() if spec.sandbox}
    chosen = sorted(sandboxes) if servers is None else list(servers)
    for name in chosen:
        if name not in sandboxes:
            known = ", ".join(sorted(sandboxes)) or "none"
            raise ConfigError(
                f"sandbox: {name!r} is not a sandbox in the recorder config (sandboxes: {known}); "
                f"set sandbox = true in its [servers.{name}] table"
            )
    if pool < 0 or max_instances < 1 or (idle_timeout is not None and idle_timeout <= 0):
        raise ConfigError(
            "sandbox pool: pool must be ≥ 0, max_instances ≥ 1 and idle_timeout > 0 seconds "
            f"(got {pool}, {max_instances}, {idle_timeout})"
        )
    return {name: sandboxes[name] for name in chosen}


def why_unavailable(
    server: str,
    timeout: float,
    *,
    exclusive_held: bool,
    at_cap: bool,
    cap: int,
    startup_timeout: float,
    failed: str | None = None,
) -> str:
    """What :class:`~replay_sim.errors.SandboxUnavailable` says when ``timeout`` passed.

    Args:
        server: The server asked for.
        timeout: Seconds the caller waited for a place.
        exclusive_held: Its isolation is ``exclusive`` and its one instance is held.
        at_cap: Every place under the cap was taken, by instances busy answering, none starting.
        cap: ``max_instances``.
        startup_timeout: The server's.
        failed: Why its last start failed, when one failed while the caller waited.
    """
    within = f"sandbox {server!r}: no instance within {timeout:g}s: "
    if failed is not None:  # the cause, not a place: more waiting would not help
        return within + f"its instances could not start (the last: {failed})"
    if exclusive_held:
        return within + (
            "its isolation is 'exclusive' (one instance at a time) and another episode holds it; "
            "give it 'state' or 'mounts' isolation so instances can run side by side"
        )
    if at_cap:
        return within + (
            f"all {cap} sandbox instances (max_instances) were busy answering calls the whole time, "
            "none idle to reclaim: raise `--max-sandboxes` if memory allows (/api/stats shows each "
            "instance's), run fewer episodes at once, or wait longer (`--sandbox-timeout`)"
        )
    return within + (
        f"an instance is still starting (startup_timeout {startup_timeout:g}s); "
        "allow a longer acquire timeout, or keep instances warm (`--sandbox-pool N`)"
    )
