"""The dev probe sets served with ``--miss sandbox`` at its defaults: precision and recall against live truth.

``fixtures/probes/`` holds an exploration of five real servers (git, filesystem, memory, time,
everything) and 238 probes (304 steps); ``fixtures/probes2/`` five others (sqlite, editor, math,
calc, thinking) and 239 probes (328 steps); ``fixtures/probes3/`` five more nobody tuned on (duckdb,
a task manager, a memory bank, excel workbooks, a Python REPL) and 202 probes (340 steps); each step
with the real server's answer. ``replay-sim
eval`` scores the resolver alone (a miss is a miss); this plays every probe as an episode over HTTP
against ``serving(..., miss="sandbox")``, each server declared a sandbox in a recorder config that
holds nothing but ``sandbox = true`` and how the set's generator starts it for the truth (command,
args, env, cwd: ``servers()`` / ``upstreams()``), its state at the fixed paths under ``/tmp`` the
generator builds (``/tmp/replay-sim-probes``, ``-probes2``, ``-probes3``). No ``mounts``, no
``isolation``, no ``reset``: confined instances find that state by the paths their command line and
the recorded calls name (``docs/sandboxes-containment.md``). The pool and ``serving`` take every
option at its default (the pool is built as ``serve --miss sandbox --config`` builds it: the store
hidden from the instances and their clocks started from it); probes are played 4 at a time.

Each step is graded against its ``truth`` (``replay_sim.canonical.answer_text``, ``_meta``
aside): correct hit, wrong hit, or miss — and by where the answer came from (the cache's tiers or
a sandbox). Every step is answerable by the real server: recall counts every step. The same
probes are then played a second time on the same replay: what the first run's instances answered
is recorded, so the cache answers it. Figures: ``docs/sandboxes-correctness.md``.

Run with ``python -m bench sandbox_probes`` (``python -m bench.sandbox_probes probes2`` for one set;
it rebuilds the sets' initial states, as the generators do: do not run it while a generator runs).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import anyio
import httpx2

import replay_sim
from bench.load import payload
from replay_sim.canonical import answer_text
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.instances.building import sandbox_pool
from replay_sim.store import Store
from replay_sim.store.interchange import import_jsonl

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = "2025-11-25"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
CONCURRENT = 4
"""Probes played at once."""


def _generator(folder: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"generate_{folder.name}", folder / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_set() -> tuple[Any, RecorderConfig]:
    """``fixtures/probes``: its initial states built, every server a sandbox launched as for the truth."""
    gen = _generator(ROOT / "fixtures" / "probes")
    gen.VENV = Path(sys.executable).parent  # this venv's mcp-server-git and mcp-server-time
    gen.ROOT.mkdir(parents=True, exist_ok=True)
    if not (gen.ROOT / "git" / "template").exists():
        gen.build_git_template(gen.ROOT / "git" / "template")
    for server in ("git", "filesystem", "memory"):
        gen.reset(server)
    servers = {}
    for name, params in gen.servers().items():
        # Through env(1), not `env`: the config's env values are secrets, redacted from every answer,
        # and these (HOME, the fixed git author) are no secrets but part of the answers.
        settings = [f"{k}={v}" for k, v in (params.env or {}).items()]
        servers[name] = UpstreamSpec(
            command="/usr/bin/env", args=(*settings, params.command, *params.args), sandbox=True
        )
    return gen, RecorderConfig(servers)


def second_set() -> tuple[Any, RecorderConfig]:
    """``fixtures/probes2``: its servers' venv and initial states; each server its command, nothing more."""
    gen = _generator(ROOT / "fixtures" / "probes2")
    gen.ensure_servers_venv()
    for server in ("sqlite", "editor"):
        gen.reset(server)
    servers = {
        name: UpstreamSpec(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd, sandbox=True)
        for name, spec in gen.upstreams(False).items()
    }
    return gen, RecorderConfig(servers)


def third_set() -> tuple[Any, RecorderConfig]:
    """``fixtures/probes3``: its servers and initial states; each config is ``sandbox = true`` and the
    command alone, as the generator recorded them."""
    gen = _generator(ROOT / "fixtures" / "probes3")
    gen.ensure_servers()
    for server in ("duckdb", "tasks", "bank", "excel"):
        gen.reset(server)
    specs = gen.upstreams()
    servers = {name: UpstreamSpec(command=s.command, args=s.args, sandbox=True) for name, s in specs.items()}
    return gen, RecorderConfig(servers)


def grade(step: dict[str, Any], response: dict[str, Any]) -> tuple[str, str]:
    """(grade, source) of one served step: ``correct``/``wrong``/``miss``, and the tier that answered."""
    truth = answer_text(step["truth"].get("result"), step["truth"].get("error"))
    if "error" in response:  # a recorded (or re-played) JSON-RPC error, or the replay refusing
        same = answer_text(None, response["error"]) == truth
        return ("correct" if same else "miss"), (
            "error" if same else f"error {response['error'].get('code')}"
        )
    result = response.get("result") or {}
    status = str((result.get("_meta") or {}).get(replay_sim.MATCH_META_KEY, {}).get("status", "?"))
    if status == "miss":
        return "miss", status
    return ("correct" if answer_text(result, None) == truth else "wrong"), status


async def _probe(
    http: httpx2.AsyncClient, base: str, probe: dict[str, Any], run: int, out: list[tuple[Any, ...]]
) -> None:
    url = f"{base}/episodes/{probe['id']}-run{run}/mcp/{probe['server']}"
    init = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}
    response = await http.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
                               headers=ACCEPT)  # fmt: skip
    headers = ACCEPT | {
        "Mcp-Session-Id": response.headers["mcp-session-id"],
        "MCP-Protocol-Version": PROTOCOL,
    }
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    for number, step in enumerate(probe["steps"], start=1):
        request = {"jsonrpc": "2.0", "id": number, "method": step["method"], "params": step["params"]}
        answered = payload(await http.post(url, json=request, headers=headers))
        verdict, source = grade(step, answered)
        out.append((probe["id"], number, probe["category"], probe["server"], verdict, source,
                    json.dumps(answered)[:700]))  # fmt: skip
    await http.delete(url, headers=headers)
    await http.delete(f"{base}/api/episodes/{probe['id']}-run{run}")


async def _runs(
    db: Path, config: RecorderConfig, tmp: Path, probes: list[dict[str, Any]]
) -> list[list[tuple[Any, ...]]]:
    # As `serve --miss sandbox --config` builds it: default sizes; the store's folder and the index
    # hidden from the instances, their clocks started when the recordings began.
    pool = sandbox_pool(config, store=db, hidden=[tmp / "index"])
    runs = []
    async with replay_sim.serving(
        db, miss="sandbox", sandboxes=pool, index_dir=tmp / "index"
    ) as sim, httpx2.AsyncClient(timeout=300) as http:  # fmt: skip
        for run in (1, 2):
            started = time.perf_counter()
            out: list[tuple[Any, ...]] = []
            limit = anyio.Semaphore(CONCURRENT)

            async def one(
                probe: dict[str, Any],
                run: int = run,
                out: list[tuple[Any, ...]] = out,
                limit: anyio.Semaphore = limit,
            ) -> None:
                async with limit:
                    await _probe(http, sim.url, probe, run, out)

            async with anyio.create_task_group() as group:
                for probe in probes:
                    group.start_soon(one, probe)
            print(f"run {run}: {len(probes)} probes in {time.perf_counter() - started:.0f} s", flush=True)
            runs.append(out)
        shown = ("started", "crashed", "failed", "last_failure")
        print("pool:", json.dumps({s: {k: f[k] for k in shown} for s, f in pool.stats().items()}))
    return runs


def report(label: str, steps: list[tuple[Any, ...]]) -> None:
    """Print one run: precision, recall (every step is answerable by a sandbox), per category, sources."""
    grades = Counter(s[4] for s in steps)
    hits = grades["correct"] + grades["wrong"]
    print(f"{label}: {len(steps)} steps, {dict(grades)}; precision "
          f"{grades['correct'] / hits if hits else 0:.3f}, recall {grades['correct'] / len(steps):.3f}; "
          f"answered by {dict(Counter(s[5] for s in steps if s[4] != 'miss'))}")  # fmt: skip
    categories: dict[str, Counter[str]] = defaultdict(Counter)
    for s in steps:
        categories[s[2]][s[4]] += 1
    for category, counts in sorted(categories.items()):
        total = sum(counts.values())
        wrong, missed = counts["wrong"], counts["miss"]
        print(f"  {category}: {counts['correct']}/{total} correct, {wrong} wrong, {missed} miss")
    for s in steps:
        if s[4] != "correct":
            print(f"  {s[4]}: {s[0]} step {s[1]} ({s[3]}, {s[2]}, {s[5]}): {s[6]}")


def main(sets: tuple[str, ...] = ()) -> None:
    """Per probe set (or only ``sets``): build its initial states, serve it with sandboxes, play it twice."""
    for folder, build in (("probes", first_set), ("probes2", second_set), ("probes3", third_set)):
        if sets and folder not in sets:
            continue
        probes_dir = ROOT / "fixtures" / folder
        _, config = build()
        probes = [json.loads(line) for line in (probes_dir / "probes.jsonl").read_text().splitlines() if line]
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "probes.db"
            with Store(db) as store:
                import_jsonl(store, probes_dir / "recordings.jsonl")
            first, second = anyio.run(_runs, db, config, Path(tmp), probes)
        report(f"fixtures/{folder}, first run", first)
        report(f"fixtures/{folder}, second run (same probes, same replay)", second)


if __name__ == "__main__":
    main(tuple(sys.argv[1:]))  # python -m bench.sandbox_probes [probes2 ...]: only those sets
