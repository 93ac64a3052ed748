"""Process-wide settings, applied only on request: thread pools, offline model hub, progress bars,
open files.

Importing :mod:`replay_sim` changes nothing process-wide, so a trainer that imports the library
keeps its own thread counts, environment variables and logging. A process that exists to run
replay-sim — the ``replay-sim`` command, a replay server — opts in with :func:`configure_runtime`.

Why one thread: the resolver's workload is one query at a time, where OpenMP fan-out only adds
latency (measured 3x for faiss on small machines), and torch's OpenMP pool fighting faiss's made
encodes 10x slower on a 2-core machine; a server scales across requests instead.

Why more open files: a server holds a descriptor per connection, and a common soft limit of 1,024
let 1,100 half-sent requests starve every other connection and the warm-up's own file opens; the
hard limit is the operator's, the soft one is ours to raise (up to :data:`MAX_OPEN_FILES`).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from dataclasses import dataclass

__all__ = [
    "ModelSettings",
    "apply_faiss_settings",
    "apply_model_settings",
    "configure_runtime",
    "model_settings",
]


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """What :func:`configure_runtime` asked of torch and transformers (applied when they load)."""

    threads: int | None
    quiet: bool


_requested: ModelSettings | None = None
MAX_OPEN_FILES = 65536
"""The soft open-files limit :func:`configure_runtime` raises to (or to the hard limit, if lower)."""


def configure_runtime(
    threads: int | None = 1, *, offline: bool = True, quiet: bool = True, open_files: bool = True
) -> None:
    """Apply replay-sim's process-wide settings (the CLI entry point calls this first).

    torch, transformers and faiss are slow to import, so their settings are applied when they
    load (the embedding model, :mod:`replay_sim.resolve.vectors`; at once if they are loaded
    already): a replay answering exact hits need not import them. The environment's apply now.

    Args:
        threads: OpenMP threads for faiss and intra-op threads for torch (None: leave them).
        offline: Set ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` (unless already set), so no
            library in this process, or a child process, reaches a model hub.
        quiet: Turn off transformers' progress bars ("Loading weights" on every model load).
        open_files: Raise the soft limit of open files towards the hard one (connections are files).
    """
    global _requested
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if open_files:
        _raise_open_files()
    _requested = ModelSettings(threads, quiet)
    if "faiss" in sys.modules:
        apply_faiss_settings()
    if "torch" in sys.modules:
        apply_model_settings()


def model_settings() -> ModelSettings | None:
    """The torch/transformers settings :func:`configure_runtime` asked for, or None."""
    return _requested


def apply_faiss_settings() -> None:
    """Apply the requested faiss threads (:mod:`replay_sim.resolve.vectors` calls this on import)."""
    if _requested is not None and _requested.threads is not None:
        import faiss

        faiss.omp_set_num_threads(_requested.threads)


def apply_model_settings(threads: int | None = None) -> None:
    """Apply the requested torch/transformers settings (the embedder calls this as it loads the model).

    Args:
        threads: torch intra-op threads asked for by the caller itself; overrides the requested ones.
    """
    settings = _requested or ModelSettings(None, quiet=False)
    threads = threads if threads is not None else settings.threads
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if settings.quiet:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # refused (a sandbox): run with what there is
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
