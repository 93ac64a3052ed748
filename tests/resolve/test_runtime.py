"""Process-wide settings: importing and using the library changes none; configure_runtime opts in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

# Libraries' own import-time side effects happen before the "before" picture; the thread counts are
# set to 3 so that "unchanged" cannot hold by accident on a small machine. Sockets are disabled:
# the model must load from local files without any environment variable telling it to.
_PRELUDE = """
import json, os, socket
import faiss, torch, sentence_transformers
from transformers.utils import logging as transformers_logging

def _no_network(*args, **kwargs):
    raise RuntimeError(f"network used: {args}")

socket.socket.connect = _no_network
socket.create_connection = _no_network
faiss.omp_set_num_threads(3)
torch.set_num_threads(3)

def picture():
    return {
        "environ": dict(os.environ),
        "faiss": faiss.omp_get_max_threads(),
        "torch": torch.get_num_threads(),
        "progress_bars": transformers_logging.is_progress_bar_enabled(),
    }

before = picture()
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    script = _PRELUDE + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)


def test_importing_replay_sim_and_loading_the_model_changes_nothing_process_wide() -> None:
    done = _run(
        """
        import replay_sim
        from replay_sim.resolve.build import build_index
        from replay_sim.resolve.embedding import default_embedder

        assert default_embedder().encode(["hello"]).shape == (1, 384)
        after = picture()
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        print(json.dumps(changed, default=str))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "{}"


def test_configure_runtime_applies_one_thread_offline_and_quiet() -> None:
    done = _run(
        """
        from replay_sim import configure_runtime
        from replay_sim.resolve.embedding import default_embedder

        configure_runtime()
        default_embedder().encode(["hello"])
        after = picture()
        print(json.dumps([after["faiss"], after["torch"], after["progress_bars"],
                          after["environ"].get("HF_HUB_OFFLINE")]))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '[1, 1, false, "1"]'


def test_configure_runtime_raises_the_soft_open_files_limit_towards_the_hard_one() -> None:
    code = textwrap.dedent(
        """
        import json, resource
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # a small soft limit, as on many hosts
        import replay_sim
        untouched = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        replay_sim.configure_runtime()
        print(json.dumps([untouched, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    untouched, raised, hard = json.loads(done.stdout.strip().splitlines()[-1])
    assert untouched == 256  # importing the library changes nothing
    assert raised == (65536 if hard == -1 else min(hard, 65536)) and raised > 256


def test_configure_runtime_sets_faiss_threads_when_faiss_is_imported_later() -> None:
    code = """
        import sys
        from replay_sim import configure_runtime

        configure_runtime()
        assert "faiss" not in sys.modules, "configure_runtime imported faiss"
        import replay_sim.resolve.vectors
        import faiss

        print(faiss.omp_get_max_threads())
        """
    env = {**os.environ, "OMP_NUM_THREADS": "3"}  # faiss's own default here, unless told otherwise
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]
