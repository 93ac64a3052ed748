"""The docs: the site builds strictly, the README fits its limit, and every shell and Python block of
the getting-started and training pages runs as written.

A block not meant to run is marked, on the line before its fence, with
``<!-- docs-test: skip (why) -->``. The blocks of a page run in order, in one temporary folder that
holds the checkout's ``fixtures``, ``server`` and ``.venv`` (the environment running this test); the
ports they name are swapped for free ones, since the machine may be serving the documented ones.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
NODE_BIN = ROOT / "fixtures/node_modules/.bin"
SKIP = "<!-- docs-test: skip"
RUNNABLE = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "sh", "python": "python", "py": "python"}
PORTS = ("8765", "8766", "8767")


def code_blocks(page: Path) -> list[tuple[str, str, bool]]:
    """``(kind, code, skipped)`` for each shell or Python block of a Markdown page, in order."""
    found = []
    text = page.read_text(encoding="utf-8")
    position = 0
    fence = re.compile(r"^```(?P<lang>[A-Za-z]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
    while (match := fence.search(text, position)) is not None:
        position = match.end()
        kind = RUNNABLE.get(match["lang"].lower())
        if kind is None:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((kind, match["code"], before.startswith(SKIP)))
    return found


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def run_page(page: Path, tmp_path: Path, timeout: float = 600) -> list[str]:
    """Run every unmarked block of ``page`` in order in a folder laid out like a checkout; their output."""
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("fixtures", "server"):
        (work / name).symlink_to(ROOT / name)
    (work / ".venv").symlink_to(BIN.parent)
    (tmp_path / "tmp").mkdir()
    ports = {port: _free_port() for port in PORTS}
    env = os.environ | {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "TMPDIR": str(tmp_path / "tmp"),
        "NO_COLOR": "1",
    }
    outputs = []
    for number, (kind, code, skipped) in enumerate(code_blocks(page), 1):
        if skipped:
            continue
        for documented, free in ports.items():
            code = code.replace(documented, free)
        command = ["bash", "-e", "-c", code] if kind == "sh" else [sys.executable, "-c", code]
        # A session of its own, so a server a failed block left running is ended with the block.
        block = subprocess.Popen(
            command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        try:
            stdout, stderr = block.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(block.pid, signal.SIGKILL)
            block.wait()
        where = f"{page.name}, block {number} ({kind})"
        assert block.returncode == 0, f"{where} failed:\n{code}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        outputs.append(stdout)
    return outputs


def test_the_readme_fits_in_300_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines; the rest belongs in docs/"


def test_the_readme_names_the_cpu_build_of_torch_and_the_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in readme
    assert "/episodes/" in readme  # the walkthrough's stateful server on an episode URL
    assert "mkdocs" in readme or "make docs" in readme


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = BIN / "mkdocs"
    if not mkdocs.exists():
        pytest.skip("mkdocs is not installed (make install: the dev extra)")
    env = os.environ | {"PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    cli = (tmp_path / "site/reference/cli/index.html").read_text(encoding="utf-8")
    assert "--miss-detail" in cli and "snapshot freeze" in cli  # generated from the click commands
    api = (tmp_path / "site/reference/api/index.html").read_text(encoding="utf-8")
    assert 'id="replay_sim.serving"' in api and 'id="replay_sim.open_replay"' in api


def test_every_runnable_block_of_the_run_pages_is_found_and_few_are_skipped() -> None:
    for page in ("getting-started.md", "training.md"):
        blocks = code_blocks(DOCS / page)
        assert blocks, page
        assert sum(skipped for _, _, skipped in blocks) <= 2, f"{page}: mark blocks to skip sparingly"


@pytest.mark.slow
@pytest.mark.skipif(
    not (NODE_BIN / "mcp-inspector").exists()
    or not (NODE_BIN / "mcp-server-memory").exists()
    or shutil.which("node") is None
    or not (BIN / "mcp-server-time").exists(),
    reason="MCP Inspector, server-memory or mcp-server-time not installed (make install)",
)
def test_the_getting_started_page_runs_as_written(tmp_path: Path) -> None:
    (walkthrough,) = run_page(DOCS / "getting-started.md", tmp_path)
    assert '\\"timezone\\": \\"Asia/Tokyo\\"' in walkthrough  # the real server's answer, through the recorder
    assert walkthrough.count('"status": "exact"') == 3
    assert '"status": "miss"' in walkthrough
    assert '\\"name\\": \\"Ada\\"' in walkthrough.rsplit('"status": "exact"', 1)[-1]  # read_graph
    assert re.search(r"^snap-[0-9a-f]+", walkthrough, re.M)


@pytest.mark.slow
def test_the_training_page_runs_as_written(tmp_path: Path) -> None:
    outputs = run_page(DOCS / "training.md", tmp_path)
    assert any("exact" in out for out in outputs)


def test_the_readme_walkthrough_is_the_getting_started_one_that_runs() -> None:
    readme = [code for kind, code, _ in code_blocks(ROOT / "README.md") if "replay-sim record" in code]
    page = [code for kind, code, skipped in code_blocks(DOCS / "getting-started.md") if not skipped]
    assert readme == page[:1], "README.md's walkthrough differs from docs/getting-started.md's (tested) one"
