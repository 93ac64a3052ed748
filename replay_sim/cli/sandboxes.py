"""Building the sandbox instance pool that ``serve --miss sandbox`` injects into the replay.

The replay side declares what it needs (``SandboxPool``); the record side implements it
(:class:`~replay_sim.record.instances.InstancePool`); this is where the two meet, as
:class:`~replay_sim.record.forward.Forwarder` meets the ``live`` policy.
"""

from __future__ import annotations

from collections.abc import Iterable

from replay_sim.errors import ConfigError
from replay_sim.record.config import RecorderConfig
from replay_sim.record.instances import DEFAULT_MAX_INSTANCES, DEFAULT_POOL, InstancePool

__all__ = ["sandbox_pool"]


def sandbox_pool(
    config: RecorderConfig,
    *,
    pool: int = DEFAULT_POOL,
    max_instances: int = DEFAULT_MAX_INSTANCES,
    idle_timeout: float | None = None,
    servers: Iterable[str] | None = None,
) -> InstancePool:
    """The pool of instances of ``config``'s sandbox servers (enter it with ``async with`` while serving).

    Args:
        config: The recorder config (``sandbox = true`` servers, their isolation, redaction rules).
        pool: Warm instances kept ready per server (``--sandbox-pool N``).
        max_instances: Live instances at most across servers (``--max-sandboxes N``).
        idle_timeout: Seconds a handed-out instance may go without a call before it is ended
            (a safety net behind the episodes' own idle expiry; None: never).
        servers: Only these sandbox servers (default: all of them).

    Raises:
        ConfigError: The config declares no sandbox, a named server is not one, or a count is out of range.
    """
    if not any(spec.sandbox for spec in config.servers.values()):
        raise ConfigError(
            "--miss sandbox needs a recorder config with at least one server declared `sandbox = true` "
            f"(its servers: {', '.join(sorted(config.servers))})"
        )
    return InstancePool(
        config, pool=pool, max_instances=max_instances, idle_timeout=idle_timeout, servers=servers
    )
