"""A pool's figures, read from the stats endpoint's thread while the event loop changes the pool."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from replay_sim.record.config import UpstreamSpec
from replay_sim.record.instances.figures import pool_figures


@dataclass(eq=False)
class Churning:
    """An instance whose liveness is read as the loop ends another instance and starts one."""

    id: str
    live: set[Churning] = field(repr=False)
    pid: int | None = None

    @property
    def alive(self) -> bool:
        for other in list(self.live):
            if other is not self:
                self.live.discard(other)  # ended meanwhile
        self.live.add(Churning(f"{self.id}+", self.live))  # and one started
        return True


def test_figures_are_taken_from_copies_while_the_pool_changes() -> None:
    live: set[Churning] = set()
    live.update(Churning(f"i-{n}", live) for n in range(3))
    warm = deque(list(live)[:1])
    spec = UpstreamSpec(command="true")
    figures = pool_figures({"s": spec}, {"s": live}, {"s": warm}, Counter(), {"s": Counter()}, {}, None)
    assert figures["s"]["live"] == 3 and figures["s"]["warm"] == 1 and figures["s"]["in_use"] == 2
