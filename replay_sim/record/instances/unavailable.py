"""Why no sandbox instance could be had, and what to change: the message of a pool's refusal."""

from __future__ import annotations

__all__ = ["why_unavailable"]


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
