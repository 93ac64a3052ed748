"""Redaction: secrets never reach the database file, and redacted recordings still key consistently."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import quote, quote_plus

import anyio
import pytest
from recording_helpers import ECHO_SERVER, PYTHON, echo_http, raw_client

from replay_sim.canonical import call_key
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.config_file import load_config
from replay_sim.record.recorder import recording
from replay_sim.redaction import REDACTED, Redactor
from replay_sim.replay.factory import open_replay
from replay_sim.store import Store
from replay_sim.store.interchange import export_jsonl, import_jsonl

SECRET = "s3cr3t-value-0123456789"
ECHO = UpstreamSpec(command=PYTHON, args=(str(ECHO_SERVER),), env={"ECHO_API_SECRET": SECRET})


@pytest.mark.parametrize(
    ("redactor", "value", "expected"),
    [
        (Redactor(secrets=[SECRET]), {"a": f"x{SECRET}y"}, {"a": f"x{REDACTED}y"}),
        (
            Redactor(),
            {"API_Key": "k", "nested": [{"accessToken": "t"}]},
            {"API_Key": REDACTED, "nested": [{"accessToken": REDACTED}]},
        ),
        (  # call-shaping arguments that merely mention tokens stay: they are not secrets
            Redactor(),
            {"max_tokens": 100, "pageToken": "p2", "progressToken": "x", "token": {"id_token": "j"}},
            {"max_tokens": 100, "pageToken": "p2", "progressToken": "x", "token": {"id_token": REDACTED}},
        ),
        (
            Redactor(),
            {"authorization": "Bearer abc", "password": None},
            {"authorization": REDACTED, "password": None},
        ),
        (Redactor(patterns=[r"sk-[a-z0-9]{8,}"]), ["use sk-abcdef123456 now"], [f"use {REDACTED} now"]),
        (Redactor(secrets=["1"]), {"n": "1 and 11"}, {"n": "1 and 11"}),  # too short to be a secret
        (Redactor(key_globs=[]), {"token": "t"}, {"token": "t"}),
        (Redactor(replacement="***"), {"secret_sauce": "ketchup"}, {"secret_sauce": "***"}),
    ],
)
def test_redactor_replaces_secret_values_keys_and_patterns(
    redactor: Redactor, value: object, expected: object
) -> None:
    assert redactor.redact(value) == expected


def test_listings_keep_schema_keys_but_lose_secret_values() -> None:
    listing = {"tools": [{"name": "login", "inputSchema": {"properties": {"token": {"type": "string"}}}}]}
    redactor = Redactor(secrets=[SECRET])
    assert redactor.redact(listing, keys=False) == listing
    assert redactor.redact({"description": f"uses {SECRET}"}, keys=False) == {
        "description": f"uses {REDACTED}"
    }


def test_header_credentials_are_secrets_with_and_without_their_scheme() -> None:
    spec = UpstreamSpec(url="http://127.0.0.1:1/mcp", headers={"Authorization": f"Bearer {SECRET}"})
    assert set(spec.secrets()) == {f"Bearer {SECRET}", SECRET}


@pytest.mark.anyio
async def test_a_secret_given_to_the_upstream_never_reaches_the_database_file(tmp_path: Path) -> None:
    db = tmp_path / "secret.db"
    spec = UpstreamSpec(command=PYTHON, args=(str(ECHO_SERVER),), env={"ECHO_API_SECRET": SECRET})
    arguments = {"text": f"the secret is {SECRET} and sk-abcdef1234567890", "api_key": "k-123"}
    redactor = Redactor(patterns=[r"sk-[a-z0-9]{8,}"])
    with anyio.fail_after(60):
        async with recording(db, {"echo": spec}, redactor) as recorder:
            async with raw_client(recorder.server("echo")) as client:
                leaked = await client.call_tool("env", {"name": "ECHO_API_SECRET"})
                echoed = await client.call_tool("echo", arguments)
            # The client still gets the real answers: redaction is for what is written.
            assert leaked.content[0].text == SECRET
            assert SECRET in echoed.content[0].text
            # Check the bytes while the recorder is open, so the -wal file still exists.
            files = [p for p in tmp_path.iterdir() if p.name.startswith("secret.db")]
            assert any(p.name.endswith("-wal") for p in files)
            for path in files:
                data = path.read_bytes()
                assert SECRET.encode() not in data, path.name
                assert b"sk-abcdef1234567890" not in data, path.name
                assert b"k-123" not in data, path.name
    with Store(db, readonly=True) as store:
        env_call, echo_call = store.recordings("echo")
    assert env_call.result["content"][0]["text"] == REDACTED
    assert echo_call.arguments == {"text": f"the secret is {REDACTED} and {REDACTED}", "api_key": REDACTED}
    # The key is computed on the redacted arguments: redacting a replayed call's arguments the same
    # way finds the recording again.
    replay_redactor = redactor.with_secrets([SECRET])
    assert echo_call.key == call_key("echo", "tools/call", "echo", replay_redactor.redact(arguments))


@pytest.mark.anyio
async def test_a_call_carrying_a_secret_replays_from_the_redacted_recording(tmp_path: Path) -> None:
    config = tmp_path / "record.toml"
    config.write_text(
        '[redaction]\npatterns = ["sk-[a-z0-9]{8,}"]\n'
        f'[servers.echo]\ncommand = "{PYTHON}"\nargs = ["{ECHO_SERVER}"]\n'
        f'env = {{ ECHO_API_SECRET = "{SECRET}" }}\n'
    )
    loaded = load_config(config)
    db = tmp_path / "r.db"
    arguments = {"text": f"about {SECRET} and sk-abcdef1234567890", "api_key": "k-123"}
    redactor = loaded.redactor.with_secrets(loaded.servers["echo"].secrets())
    with anyio.fail_after(60):
        async with (
            recording(db, loaded.servers, redactor) as recorder,
            raw_client(recorder.server("echo")) as client,
        ):
            await client.call_tool("echo", arguments)
    params = {"name": "echo", "arguments": arguments}
    # The replay redacts incoming calls with the recorder config's rules and secrets: an exact hit.
    answer = await open_replay(db, redactor=redactor).resolve("echo", "tools/call", params)
    assert answer.resolution.tier == "exact"
    # Without the recorder's secret values, the secret-bearing text cannot match (nor leak).
    missed = await open_replay(db).resolve("echo", "tools/call", params)
    assert missed.resolution.tier == "miss"


@pytest.mark.anyio
async def test_the_store_keeps_the_redaction_rules_and_the_replay_applies_them(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    redactor = Redactor(key_globs=["session_ref"], patterns=[r"sk-[a-z0-9]{8,}"])
    arguments = {"text": "key sk-abcdef1234567890", "session_ref": "abc"}
    with anyio.fail_after(60):
        async with (
            recording(db, {"echo": ECHO}, redactor) as recorder,
            raw_client(recorder.server("echo")) as client,
        ):
            await client.call_tool("echo", arguments)
    with Store(db, readonly=True) as store:
        assert store.meta("redaction")["key_globs"] == ["session_ref"]
        assert SECRET not in json.dumps(store.meta("redaction"))
    # Another secret key and another key value: both are redacted the recording's way, so they match.
    other = {"text": "key sk-zzzzzzzz99999999", "session_ref": "xyz"}
    answer = await open_replay(db).resolve("echo", "tools/call", {"name": "echo", "arguments": other})
    assert answer.resolution.tier == "exact"


@pytest.mark.anyio
async def test_recording_again_into_a_store_redacts_with_the_rules_it_already_holds(tmp_path: Path) -> None:
    db = tmp_path / "again.db"
    plain = UpstreamSpec(command=PYTHON, args=(str(ECHO_SERVER),))
    with anyio.fail_after(60):
        async with recording(db, {"echo": plain}, Redactor(patterns=[r"sk-[a-z0-9]{8,}"])):
            pass  # the first recording brings the rules; the store keeps them
        async with (
            recording(db, {"echo": plain}) as recorder,  # the default rules: no pattern
            raw_client(recorder.server("echo")) as client,
        ):
            await client.call_tool("echo", {"text": "key sk-abcdef1234567890"})
    with Store(db, readonly=True) as store:
        (call,) = store.recordings("echo")
        assert store.meta("redaction")["patterns"] == ["sk-[a-z0-9]{8,}"]
    assert call.arguments == {"text": f"key {REDACTED}"}
    assert call.result is not None and "sk-abcdef1234567890" not in json.dumps(call.result)


@pytest.mark.anyio
async def test_an_imported_call_with_a_password_argument_matches_its_exact_repeat(tmp_path: Path) -> None:
    # Recorded by a recorder told to redact no key, exported, imported: the JSONL carries no rules.
    plain = UpstreamSpec(command=PYTHON, args=(str(ECHO_SERVER),))
    arguments = {"text": "log in", "password": "pw-0123456789"}
    with anyio.fail_after(60):
        async with (
            recording(tmp_path / "recorded.db", {"echo": plain}, Redactor(key_globs=())) as recorder,
            raw_client(recorder.server("echo")) as client,
        ):
            await client.call_tool("echo", arguments)
    exported = tmp_path / "calls.jsonl"
    with Store(tmp_path / "recorded.db", readonly=True) as store, exported.open("w") as out:
        export_jsonl(store, out)
    imported = tmp_path / "imported.db"
    with Store(imported) as store:
        import_jsonl(store, exported)
        assert store.meta("redaction") is None
    params = {"name": "echo", "arguments": arguments}
    # The store's recordings were redacted by no key, so neither is the incoming call: an exact hit.
    answer = await open_replay(imported).resolve("echo", "tools/call", params)
    assert answer.resolution.tier == "exact"
    # `--config` rules still apply when given (the default key rules blank the password: a miss).
    redacted = await open_replay(imported, redactor=Redactor()).resolve("echo", "tools/call", params)
    assert redacted.resolution.tier == "miss"


QUOTED = 'pa"ss\\w0rd-\u00e9t\u00e9-42'  # a quote, a backslash and non-ASCII: JSON escapes all three
BASIC_PASSWORD = 'b4sic"pw\\x-99'
BASIC = base64.b64encode(f"alice:{BASIC_PASSWORD}".encode()).decode()


def _json_escaped(value: str, *, ascii_only: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)[1:-1]


def _encodings(secret: str) -> set[str]:
    """Every form a secret can be written in: raw, JSON-escaped (once and twice), URL, base64."""
    once = {_json_escaped(secret), _json_escaped(secret, ascii_only=True)}
    twice = {_json_escaped(e, ascii_only=a) for e in once for a in (False, True)}
    return {
        secret, *once, *twice, quote(secret, safe=""), quote_plus(secret),
        base64.b64encode(secret.encode()).decode(),
    }  # fmt: skip


@pytest.mark.parametrize("encoding", sorted(_encodings(QUOTED)))
def test_every_encoding_of_a_secret_is_redacted(encoding: str) -> None:
    assert Redactor(secrets=[QUOTED]).redact({"text": f"<{encoding}>"}) == {"text": f"<{REDACTED}>"}


def test_a_basic_auth_header_makes_its_decoded_credentials_secrets_too() -> None:
    spec = UpstreamSpec(url="http://127.0.0.1:1/mcp", headers={"Authorization": f"Basic {BASIC}"})
    assert {f"Basic {BASIC}", BASIC, f"alice:{BASIC_PASSWORD}", BASIC_PASSWORD} <= set(spec.secrets())


@pytest.mark.anyio
async def test_no_encoding_of_a_secret_with_quotes_or_backslashes_reaches_the_database_file(
    tmp_path: Path,
) -> None:
    db = tmp_path / "escaped.db"
    texts = [
        json.dumps({"config": {"pw": QUOTED}}),  # a JSON document inside a result: escaped once
        json.dumps(json.dumps({"pw": QUOTED})),  # and twice
        json.dumps({"pw": QUOTED}, ensure_ascii=True),
        f"https://example.com/login?pw={quote(QUOTED, safe='')}&again={quote_plus(QUOTED)}",
        f"blob {base64.b64encode(QUOTED.encode()).decode()} end",
        f"header was Basic {BASIC}; user alice:{BASIC_PASSWORD}; {json.dumps(BASIC_PASSWORD)}",
    ]
    with anyio.fail_after(90):
        async with echo_http() as url:
            upstreams = {
                "echo": UpstreamSpec(
                    command=PYTHON, args=(str(ECHO_SERVER),), env={"ECHO_API_SECRET": QUOTED}
                ),
                "web": UpstreamSpec(url=url, headers={"Authorization": f"Basic {BASIC}"}),
            }
            async with recording(db, upstreams) as recorder:
                async with raw_client(recorder.server("echo")) as client:
                    assert (await client.call_tool("env", {"name": "ECHO_API_SECRET"})).content[
                        0
                    ].text == QUOTED
                    for text in texts:
                        await client.call_tool("echo", {"text": text})
                async with raw_client(recorder.server("web")) as client:
                    for text in texts:
                        await client.call_tool("echo", {"text": text})
                files = [p for p in tmp_path.iterdir() if p.name.startswith("escaped.db")]
                assert any(p.name.endswith("-wal") for p in files)
                forms = _encodings(QUOTED) | _encodings(BASIC_PASSWORD) | {BASIC}
                for path in files:
                    data = path.read_bytes()
                    found = [form for form in forms if form.encode() in data]
                    assert found == [], path.name
    with Store(db, readonly=True) as store:
        assert len(store.recordings()) == 1 + 2 * len(texts)
