"""The pool's safety net: handed-out instances no call has used for a while are ended.

The replay gives an idle instance back itself (``serve --sandbox-idle``); this catches an owner that
never does, so it cannot hold a place under the pool's cap for ever.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from replay_sim.record.instances.instance import Instance

__all__ = ["end_idle", "expire_idle"]


def expire_idle(
    owned: set[Instance], idle: float, end: Callable[[Instance], None]
) -> Callable[[], Coroutine[Any, Any, None]]:
    """A task that ends (``end``) the instances of ``owned`` no call has used for ``idle`` seconds,
    never one mid-call, taking each out of ``owned``; it runs until cancelled.
    """

    async def expiring() -> None:
        while True:
            now = anyio.current_time()
            due = now + idle
            for instance in list(owned):
                since = instance.idle_since
                if since is None:
                    continue
                if since + idle <= now:
                    owned.discard(instance)
                    end(instance)
                else:
                    due = min(due, since + idle)
            await anyio.sleep(due - now)

    return expiring


async def end_idle(instance: Instance) -> None:
    """Close an instance ended for idleness, saying so."""
    since = instance.idle_since or anyio.current_time()
    await instance.close(because=f"no call for {anyio.current_time() - since:.0f}s, its idle timeout")
