"""The miss policies by name: the registry ``--miss`` chooses from."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from replay_sim.errors import ConfigError
from replay_sim.replay.core.misses import ErrorPolicy, MissPolicy
from replay_sim.replay.options import MissPolicyName
from replay_sim.replay.policies.live import LivePolicy
from replay_sim.replay.policies.miss import MissSettings, NearestPolicy
from replay_sim.replay.policies.sandbox import SandboxPolicy
from replay_sim.replay.policies.synthesize import SynthesizePolicy

__all__ = ["MISS_POLICIES", "make_policy", "serving_policy"]

MISS_POLICIES: dict[MissPolicyName, Callable[[MissSettings], MissPolicy]] = {
    MissPolicyName.ERROR: lambda settings: ErrorPolicy(),  # the miss is its own answer
    MissPolicyName.NEAREST: NearestPolicy,
    MissPolicyName.LIVE: LivePolicy,
    MissPolicyName.SANDBOX: SandboxPolicy,
    MissPolicyName.SYNTHESIZE: SynthesizePolicy,
}
"""Miss policies by name."""


def make_policy(name: str | MissPolicyName, settings: MissSettings) -> MissPolicy:
    """Build the named miss policy (behind the ``sandbox`` policy's servers when a pool is given).

    Raises:
        ConfigError: Unknown policy name, or settings the policy needs are missing.
    """
    try:
        factory = MISS_POLICIES[MissPolicyName(name)]
    except ValueError:
        known = ", ".join(MissPolicyName)
        raise ConfigError(f"unknown miss policy {name!r}; choose one of {known}") from None
    policy = factory(settings)
    if settings.sandboxes is not None and not isinstance(policy, SandboxPolicy):
        # Servers declared `miss = "sandbox"` in the recorder config: theirs, the rest the named policy's.
        return SandboxPolicy(settings, fallback=policy)
    return policy


def serving_policy(
    name: str | MissPolicyName, settings: MissSettings
) -> tuple[MissPolicy, tuple[AbstractAsyncContextManager[Any], ...]]:
    """The named policy (:func:`make_policy`) and what serving holds open for it.

    What is held: the connections ``settings`` forwards through (``live``), and the policy itself
    when it holds something (the ``sandbox`` policy's instances). Hand both to
    :class:`~replay_sim.replay.core.replay.Replay`.

    Raises:
        ConfigError: As :func:`make_policy`.
    """
    policy = make_policy(name, settings)
    held = (settings.connections, policy)
    return policy, tuple(h for h in held if isinstance(h, AbstractAsyncContextManager))
