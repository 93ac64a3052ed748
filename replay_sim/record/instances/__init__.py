"""Sandbox instances of real servers: started per owner, isolated, pooled, ended with their state.

The record side of the replay's ``sandbox`` miss policy (issue 18): :class:`InstancePool` implements
the replay's ``SandboxPool`` and :class:`Instance` its ``SandboxInstance``. The replay never imports
this package; serving builds the pool (:func:`.building.sandbox_pool`) and injects it.

- :mod:`.workspace` — an instance's workspace (its copy of ``state`` or of ``mounts``) and launch
  (parent-death signal, PID and mount namespaces);
- :mod:`.instance` — one instance: start, call, crash detection, close;
- :mod:`.pool` — warm instances per server, the cap, acquire with a bound, stats;
- :mod:`.places` — places under the cap: who gets one, which idle instance ends to make room;
- :mod:`.snapshots` — state snapshots: an idle instance's files copied, to start later instances from;
- :mod:`.procfs` — memory of an instance's process group.
"""

from replay_sim.record.instances.instance import Instance
from replay_sim.record.instances.pool import DEFAULT_MAX_INSTANCES, DEFAULT_POOL, InstancePool

__all__ = ["DEFAULT_MAX_INSTANCES", "DEFAULT_POOL", "Instance", "InstancePool"]
