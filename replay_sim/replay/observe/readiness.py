"""Readiness of a replay server: every tier can answer (the model loads on first need), or it says why not.

A replay server answers exact hits the moment it listens, but a call that needs the vector index
or a tool's matching state waits for the background warm-up
(:class:`~replay_sim.resolve.warmup.Warmup`). So *ready* means the app's lifespan has started
(every MCP endpoint runs) **and** the warm-up has loaded the index. What a trainer replaying
exact hits never needs is not part of it: a tool's matching state (canonical forms, calibrated
threshold: read from all its recordings) is built by the tool's first canonical or semantic call,
and the embedding model (seconds of CPU) is loaded by the first call that embeds a query — a
semantic match, a miss's nearest recordings — each in that call's worker thread.
:meth:`Readiness.model` and :meth:`Readiness.tools` say how far that is (``/api/ready``'s
``embedding_model`` and ``tools_prepared``). ``GET /api/ready``
answers 200 only once ready, ``replay-sim serve`` prints its ``listening on URL`` line only then,
and :func:`~replay_sim.replay.http.serving.serving` returns only then (unless told not to wait). A
warm-up that failed is reported here (and retried), never silently gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from replay_sim.resolve.warmup import Warmup

__all__ = ["Readiness", "still_loading"]


class Readiness:
    """Whether a replay server is ready, why not, and a way to wait for it.

    Args:
        warmup: The resolver's warm-up (the index).
        model_loaded: Whether the embedding model is loaded (default: say nothing of it).
        prepared_tools: How many tools' matching state is built (default: say nothing of it).
    """

    def __init__(
        self,
        warmup: Warmup,
        model_loaded: Callable[[], bool] | None = None,
        prepared_tools: Callable[[], int] | None = None,
    ) -> None:
        self.warmup = warmup
        self.model_loaded = model_loaded
        self.prepared_tools = prepared_tools
        self._serving = threading.Event()

    def serving(self, running: bool) -> None:
        """Say that the app's lifespan has started (True) or is stopping (False)."""
        if running:
            self._serving.set()
        else:
            self._serving.clear()

    @property
    def ready(self) -> bool:
        """Whether every MCP endpoint runs and every tier answers at its usual speed."""
        return self._serving.is_set() and self.warmup.done

    def problems(self) -> list[str]:
        """Why the server is not ready yet (empty when it is)."""
        said = [] if self._serving.is_set() else ["the MCP endpoints are not running (starting or stopping)"]
        problem = self.warmup.problem()
        return said if problem is None else [*said, problem]

    def model(self) -> str:
        """The embedding model's state, in a phrase: loaded, or when it will be."""
        if self.model_loaded is None or self.model_loaded():
            return "loaded"
        return (
            "not loaded: the first call that embeds a query (a semantic match, a miss's nearest "
            "recordings) loads it, seconds"
        )

    def tools(self) -> int | None:
        """How many tools' matching state is built (each by the tool's first call needing it)."""
        return None if self.prepared_tools is None else self.prepared_tools()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until ready (True) or ``timeout`` seconds have passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._serving.wait(timeout):
            return False
        return self.warmup.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))


def still_loading(warmup: Warmup, waited: float) -> str:
    """The miss reason of a call that needs what the warm-up still loads, answered after ``waited`` s."""
    why = warmup.problem() or "loading the index"
    return (
        f"the replay is still starting ({why}; waited {waited:g} s): retry once GET /api/ready "
        "answers 200 (replay-sim serve prints 'listening on URL' then)"
    )


def model_loading(waited: float) -> str:
    """The miss reason of a call that needs the embedding model while it loads, after ``waited`` s."""
    return (
        f"the embedding model is still loading (the first call that needs it loads it; waited "
        f"{waited:g} s): retry shortly — GET /api/ready says embedding_model 'loaded' once it is"
    )
