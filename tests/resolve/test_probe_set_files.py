"""The committed third dev probe set (``fixtures/probes3``) is well-formed: no network, no server start.

Every probe names a recorded server and categories the scorer knows, every step has the real
server's answer as truth, the recorded sessions a probe replays whole got the answers the recording
holds, the recordings import, and nothing in them depends on where the repository is checked out.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from replay_sim.store import Store
from replay_sim.store.interchange import import_jsonl

SET = Path(__file__).resolve().parents[2] / "fixtures" / "probes3"
CATEGORIES = {
    "exact_repeat",
    "key_reorder",
    "schema_default",
    "case_whitespace",
    "paraphrase",
    "different_identifier",
    "unseen_tool",
    "invalid_arguments",
    "mutation_then_read",
}


def _lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (SET / name).read_text(encoding="utf-8").splitlines() if line]


def test_every_probe_names_a_recorded_server_and_every_step_has_the_real_answer() -> None:
    probes, recordings = _lines("probes.jsonl"), _lines("recordings.jsonl")
    servers = {line["server"] for line in recordings if line["type"] == "server"}
    called = {line["server"] for line in recordings if line["type"] == "call"}
    assert servers == called == {"duckdb", "tasks", "bank", "excel", "python"}
    assert [p["id"] for p in probes] == [f"p{n:04d}" for n in range(1, len(probes) + 1)]
    assert 150 <= len(probes) <= 250
    assert set(Counter(p["category"] for p in probes)) == CATEGORIES
    for probe in probes:
        assert probe["server"] in servers, probe["id"]
        assert probe["steps"], probe["id"]
        for step in probe["steps"]:
            assert step["method"] == "tools/call", probe["id"]
            assert isinstance(step["params"]["name"], str) and "arguments" in step["params"], probe["id"]
            truth = step["truth"]
            assert set(truth) == {"result", "error"}, probe["id"]
            assert (truth["result"] is None) != (truth["error"] is None), probe["id"]
            if truth["result"] is not None:
                assert isinstance(truth["result"].get("content"), list), probe["id"]
    # Multi-step stateful probes: writes then reads, on every server.
    multi = [p for p in probes if p["category"] == "mutation_then_read" and len(p["steps"]) > 1]
    stateful = Counter(p["server"] for p in multi)
    assert set(stateful) == servers and min(stateful.values()) >= 8


def test_whole_recorded_sessions_replayed_as_probes_got_the_recorded_answers() -> None:
    probes, recordings = _lines("probes.jsonl"), _lines("recordings.jsonl")
    sessions: dict[str, list[dict[str, Any]]] = {}
    for line in recordings:
        if line["type"] == "call":
            sessions.setdefault(line["session"], []).append(line)
    replays = [p for p in probes if p["note"].startswith("replay of ")]
    replayed = {p["note"].removeprefix("replay of ") for p in replays}
    assert replayed == {s for s in sessions if not s.endswith("-read")}
    for probe in replays:
        calls = sessions[probe["note"].removeprefix("replay of ")]
        assert [s["params"] for s in probe["steps"]] == [c["params"] for c in calls], probe["id"]
        assert [s["truth"] for s in probe["steps"]] == [
            {"result": c["result"], "error": c["error"]} for c in calls
        ], probe["id"]


def test_the_recordings_import_and_name_no_checkout_path(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as store:
        import_jsonl(store, SET / "recordings.jsonl")
    for name in ("recordings.jsonl", "probes.jsonl"):
        text = (SET / name).read_text(encoding="utf-8")
        # Truth must not depend on where the repository lives (a traceback through the servers' venv).
        assert str(SET.parent.parent) not in text and "/site-packages/" not in text, name
        assert "/tmp/replay-sim-probes3/" in text, name


def test_the_servers_are_pinned_to_exact_versions() -> None:
    for line in (SET / "requirements-servers.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9.+\-]*", line), line
    package = json.loads((SET / "package.json").read_text())
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in package["dependencies"].values())
    lock = json.loads((SET / "package-lock.json").read_text())
    for name, version in package["dependencies"].items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
