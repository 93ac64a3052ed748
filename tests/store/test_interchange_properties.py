"""Property test (hypothesis): any store content, exported and re-imported, gives an identical store.

Recorded text is any Unicode without lone surrogates — the line and paragraph separators U+2028,
U+2029 and U+0085 and every other code point ``str.splitlines`` splits on included — at any
nesting the format allows and at sizes from empty to long.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from replay_sim.protocol import LISTING_FIELDS
from replay_sim.store import Origin, ServerRecord, Store
from replay_sim.store.interchange import export_jsonl, import_jsonl

_SEPARATORS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00\ufeff\U0010ffff"
texts = st.text(max_size=12) | st.text(
    alphabet=st.sampled_from(_SEPARATORS) | st.characters(codec="utf-8"), max_size=12
)
long_texts = st.text(
    alphabet=st.sampled_from(_SEPARATORS) | st.characters(codec="utf-8"), min_size=200, max_size=2000
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)
objects = st.dictionaries(texts, values, max_size=3)
results = objects | st.builds(lambda text: {"content": [{"type": "text", "text": text}]}, long_texts)
names = texts.filter(bool)


def _deep(depth: int, leaf: Any) -> Any:
    for n in range(depth):
        leaf = [leaf] if n % 2 else {"k": leaf}
    return leaf


deep_objects = st.builds(lambda depth, leaf: {"deep": _deep(depth, leaf)}, st.integers(0, 120), scalars)


@st.composite
def calls(draw: st.DrawFn, servers: list[str], sessions: list[str]) -> dict[str, Any]:
    method = draw(st.sampled_from(["tools/call", "prompts/get", "resources/read", "completion/complete"]))
    if method == "resources/read":
        params: dict[str, Any] = {"uri": draw(texts)}
    elif method == "completion/complete":
        params = {"ref": {"type": "ref/prompt", "name": draw(texts)}, "argument": draw(objects)}
    else:
        params = {"name": draw(texts), "arguments": draw(objects | deep_objects)}
    failed = draw(st.booleans())
    return {
        "server": draw(st.sampled_from(servers)),
        "method": method,
        "params": params,
        "result": None if failed else draw(results | deep_objects),
        "error": {"code": draw(st.integers(-(2**31), 2**31)), "message": draw(texts), "data": draw(values)}
        if failed
        else None,
        "session": draw(st.sampled_from([None, *sessions])),
        "latency_ms": draw(st.none() | st.floats(0, 86_400_000)),
        "origin": draw(st.sampled_from(list(Origin))),
        "notifications": draw(st.lists(objects, max_size=1)),
    }


@st.composite
def contents(draw: st.DrawFn) -> dict[str, Any]:
    servers = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    return {
        "servers": [
            ServerRecord(
                name,
                {"name": draw(texts), "version": draw(texts), "x-extra": draw(values)},
                draw(st.sampled_from([{}, {"tools": {"listChanged": True}}, {"experimental": {"x": {}}}])),
                draw(st.none() | names),
                draw(st.none() | texts),
            )
            for name in servers
        ],
        "listings": [
            (server, method, {LISTING_FIELDS[method]: draw(st.lists(objects, max_size=2)), **draw(objects)})
            for server in servers
            for method in draw(st.lists(st.sampled_from(list(LISTING_FIELDS)), unique=True, max_size=2))
        ],
        "calls": draw(st.lists(calls(servers, draw(st.lists(names, max_size=3, unique=True))), max_size=5)),
    }


def _export(store: Store) -> str:
    out = io.StringIO()
    export_jsonl(store, out)
    return out.getvalue()


def _snapshot(store: Store) -> tuple[Any, ...]:
    servers = store.servers()
    listings = {s.name: store.listings(s.name) for s in servers}
    return servers, listings, store.recordings(), store.sessions()


@settings(max_examples=60, deadline=None)
@given(contents())
def test_any_store_content_exported_and_imported_gives_an_identical_store(content: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        with Store(Path(folder, "a.db")) as a:
            for server in content["servers"]:
                a.put_server(server)
            for listing in content["listings"]:
                a.put_listing(*listing)
            started: set[str] = set()
            for n, call in enumerate(content["calls"]):
                at = f"2026-11-29T14:00:{n:02d}.000001Z"
                if call["session"] is not None and call["session"] not in started:
                    started.add(call["session"])
                    a.start_session(call["server"], call["session"], at)
                a.record_call(**call, recorded_at=at)
            exported = _export(a)
            before = _snapshot(a)
        path = Path(folder, "a.jsonl")
        path.write_text(exported, encoding="utf-8")
        with Store(Path(folder, "b.db")) as b:
            counts = import_jsonl(b, path)
            assert counts["call"] == len(content["calls"]) and counts["duplicate"] == 0
            assert _snapshot(b) == before
            assert _export(b) == exported
