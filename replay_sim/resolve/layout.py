"""Where a store's vector index lives: its default folder and its manifest's name.

Apart from :mod:`replay_sim.resolve.index` (numpy, faiss) so that a ``serve --stdio`` start finds
the folder (:mod:`replay_sim.replay.stdio.start` keeps what it answers from there) before loading them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_INDEX_DIR", "MANIFEST"]

DEFAULT_INDEX_DIR = Path("index")
"""The index folder when none is given (``--index-dir``), relative to the working directory."""
MANIFEST = "manifest.json"
"""The index's manifest in its folder (model, store fingerprint, partitions)."""
