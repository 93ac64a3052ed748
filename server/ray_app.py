"""The replay-sim Ray Serve application, for ``serve run`` / ``serve deploy`` (see server/README.md).

``server/ray.yaml`` names :func:`replay_sim.scale.deploy.app_builder` directly, so the installed
package is all a cluster needs; this module is the same application for the ``serve run`` command
line, with the snapshot from the environment when no argument names it::

    REPLAY_SIM_SNAPSHOT=/data/snapshots/v1 serve run server.ray_app:build replicas=4
    serve run server.ray_app:build snapshot=/data/snapshots/v1 replicas=4 max_ongoing_requests=256

Arguments are :class:`replay_sim.scale.deploy.ScaleSettings`' fields (numbers as text on the
command line are converted here).
"""

from __future__ import annotations

import os
from typing import Any

from ray import serve

from replay_sim.scale.deploy import ScaleSettings, app_builder

_NUMBERS = {
    "replicas",
    "max_ongoing_requests",
    "autoscale_min",
    "autoscale_max",
    "gateways",
    "port",
    "max_body",
}
_FLOATS = {"replica_cpus", "target_ongoing_requests"}


def build(args: dict[str, Any]) -> serve.Application:
    """The application for ``serve run server.ray_app:build key=value ...``."""
    values: dict[str, Any] = dict(args)
    if "snapshot" not in values and os.environ.get("REPLAY_SIM_SNAPSHOT"):
        values["snapshot"] = os.environ["REPLAY_SIM_SNAPSHOT"]
    for name in _NUMBERS & set(values):
        values[name] = int(values[name])
    for name in _FLOATS & set(values):
        values[name] = float(values[name])
    return app_builder(values)


__all__ = ["ScaleSettings", "build"]
