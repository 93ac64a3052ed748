"""A real server asks the client mid-call (elicitation): recorded through the proxy, asked again on replay.

The fixture server's ``greet`` tool sends ``elicitation/create`` and answers with the name the
client gives. The recorder must forward the question to its client and record the exchange; the
replay must ask its client again and serve the recorded answer only if the client answers the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from recording_helpers import ECHO_SERVER, PYTHON, proxy_stdio
from replay_helpers import match_of, text_result

from replay_sim.listener import serving_in_thread
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.recorder import recording
from replay_sim.replay.core.conversation import suited
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import ServerRecord, Store


class User:
    """An MCP client's elicitation handler: answers with a name (or declines) and counts the questions."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        if self.name is None:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"name": self.name})


async def greet(
    target: Any, user: User | None, mode: Any = "legacy", meta: Any = None
) -> tuple[str, bool, Any]:
    """Call ``greet`` with a client that can (``user``) or cannot (None) be asked."""
    return await greet_with(target, "greet", user, mode, meta)


async def greet_with(
    target: Any, tool: str, user: User | None, mode: Any = "auto", meta: Any = None
) -> tuple[str, bool, Any]:
    """Call ``tool`` with a client that can (``user``) or cannot (None) be asked."""
    async with Client(target, mode=mode, cache=None, elicitation_callback=user) as client:
        assert (client.protocol_version in MODERN_PROTOCOL_VERSIONS) == (mode == "auto")
        result = await client.call_tool(tool, {}, meta=meta)
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text, bool(result.is_error), result


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_question_is_forwarded_recorded_and_asked_again_on_replay(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    ada = User("Ada")
    assert (await greet(proxy_stdio(db, "echo", [PYTHON, ECHO_SERVER]), ada))[:2] == ("Hello, Ada!", False)
    assert ada.asked == ["What is your name?"]
    # A client that declares no elicitation is not asked, and the server answers it as it would.
    assert (await greet(proxy_stdio(db, "echo", [PYTHON, ECHO_SERVER]), None))[:2] == (
        "I cannot ask this client anything",
        True,
    )

    store = Store(db)
    asked = next(r for r in store.recordings(name="greet") if not r.result.get("isError"))
    (exchange,) = asked.notifications
    assert exchange["method"] == "elicitation/create"
    assert exchange["params"]["message"] == "What is your name?"
    assert exchange["result"] == {"action": "accept", "content": {"name": "Ada"}}

    replay = Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))
    with serving_in_thread(create_app(replay)) as url:
        endpoint = f"{url}/mcp/echo"
        again = User("Ada")
        text, failed, result = await greet(endpoint, again)
        assert (text, failed, again.asked) == ("Hello, Ada!", False, ["What is your name?"])
        assert match_of(result)["status"] == "exact"
        # Another answer would have made the real server say something else: a diagnosed miss.
        text, failed, result = await greet(endpoint, User("Bob"))
        assert failed and match_of(result)["status"] == "miss"
        assert "answered elicitation/create otherwise" in text and '"Bob"' in text
        text, failed, _ = await greet(endpoint, User(None))
        assert failed and '"decline"' in text
        # The client that cannot be asked gets what the real server told such a client.
        assert (await greet(endpoint, None))[:2] == ("I cannot ask this client anything", True)
        # A 2026-07-28 client is asked in an input_required result and retries with its answer.
        # (Over HTTP it has no session: greet may change state, so it names an episode.)
        modern, episode = User("Ada"), {"replay-sim/episode": "modern-ada"}
        text, failed, result = await greet(endpoint, modern, mode="auto", meta=episode)
        assert (text, failed, modern.asked) == ("Hello, Ada!", False, ["What is your name?"])
        assert match_of(result)["status"] == "exact"
        episode = {"replay-sim/episode": "modern-bob"}
        text, failed, result = await greet(endpoint, User("Bob"), mode="auto", meta=episode)
        assert failed and "answered elicitation/create otherwise" in text and '"Bob"' in text
    store.close()


_ASKED = {
    "method": "elicitation/create",
    "params": {"message": "What is your name?"},
    "result": {"action": "accept", "content": {"name": "Ada"}},
}


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_2026_era_client_is_asked_through_input_required_while_recording(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    ada = User("Ada")
    text, failed, _ = await greet(proxy_stdio(db, "echo", [PYTHON, ECHO_SERVER]), ada, mode="auto")
    assert (text, failed, ada.asked) == ("Hello, Ada!", False, ["What is your name?"])
    store = Store(db)
    (recorded,) = store.recordings(name="greet")
    assert recorded.params == {"name": "greet", "arguments": {}}  # the retry's fields are not the call's
    assert [m["result"] for m in recorded.notifications] == [{"action": "accept", "content": {"name": "Ada"}}]
    replay = Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))
    with serving_in_thread(create_app(replay)) as url:
        assert (await greet(f"{url}/mcp/echo", User("Ada")))[:2] == ("Hello, Ada!", False)
    store.close()


@pytest.mark.parametrize("asking_first", [True, False])
def test_the_recording_made_for_a_client_like_this_one_is_chosen(tmp_path: Path, asking_first: bool) -> None:
    store = Store(tmp_path / "r.db")
    params = {"name": "greet", "arguments": {}}
    ask = {"result": text_result("Hello, Ada!"), "notifications": [_ASKED]}
    cannot = {"result": text_result("I cannot ask this client anything")}
    for kind in [ask, cannot] if asking_first else [cannot, ask]:
        store.record_call("echo", "tools/call", params, **kind)
    same = store.recordings(name="greet")
    by_answer = {r.result["content"][0]["text"]: r for r in same}
    assert suited(same, frozenset({"elicitation"})) is by_answer["Hello, Ada!"]
    assert suited(same, frozenset({"sampling"})) is by_answer["I cannot ask this client anything"]
    assert suited(same, frozenset()) is by_answer["I cannot ask this client anything"]
    # Only the asking recording: a client that cannot be asked has no recording made for it.
    assert suited([by_answer["Hello, Ada!"]], frozenset()) is None
    store.close()


@pytest.mark.slow
@pytest.mark.anyio
async def test_only_the_retry_of_the_asking_call_answers_its_question(tmp_path: Path) -> None:
    echo = UpstreamSpec(command=PYTHON, args=(str(ECHO_SERVER),))
    ada = types.ElicitResult(action="accept", content={"name": "Ada"})
    with anyio.fail_after(60):
        async with (
            recording(tmp_path / "r.db", {"echo": echo}) as recorder,
            Client(recorder.server("echo"), cache=None, elicitation_callback=User("Ada")) as client,
        ):
            asking = await client.session.call_tool("greet", {}, allow_input_required=True)
            assert isinstance(asking, types.InputRequiredResult) and asking.request_state
            # Another call that carries the question's requestState is just another call.
            other = await client.session.call_tool(
                "echo", {"text": "hi"}, request_state=asking.request_state, input_responses={"0": ada}
            )
            assert isinstance(other, types.CallToolResult) and other.content[0].text == "hi"
            done = await client.session.call_tool(
                "greet", {}, request_state=asking.request_state, input_responses={"0": ada}
            )
    assert isinstance(done, types.CallToolResult) and done.content[0].text == "Hello, Ada!"
    with Store(tmp_path / "r.db", readonly=True) as store:
        assert [r.name for r in store.recordings("echo")] == ["echo", "greet"]


def _asks(message: str, name: str) -> dict[str, Any]:
    form = {"type": "object", "properties": {"name": {"type": "string"}}}
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": form},
        "result": {"action": "accept", "content": {"name": name}},
    }


class Answers(User):
    """Answers each question with the next name of a list."""

    def __init__(self, *names: str) -> None:
        super().__init__(None)
        self.names = list(names)

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": self.names[len(self.asked) - 1]})


@pytest.mark.anyio
async def test_a_2026_era_client_answers_recorded_questions_one_round_each(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    store.put_server(ServerRecord("survey", {"name": "survey", "version": "1"}, {"tools": {}}, "2025-11-25"))
    tool = {"name": "pair", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    store.put_listing("survey", "tools/list", {"tools": [tool]})
    questions = [_asks("First name?", "Ada"), _asks("Second name?", "Alan")]
    store.record_call(
        "survey",
        "tools/call",
        {"name": "pair", "arguments": {}},
        result=text_result("Ada and Alan"),
        notifications=questions,
    )
    replay = Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))
    with serving_in_thread(create_app(replay)) as url:
        async with Client(
            f"{url}/mcp/survey", cache=None, elicitation_callback=Answers("Ada", "Alan")
        ) as client:
            first = await client.session.call_tool("pair", {}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult)
            assert [r.params.message for r in first.input_requests.values()] == ["First name?"]  # type: ignore[union-attr]
            # A forged requestState cannot skip the first question: the answer to the second is
            # checked against the first.
            alan = types.ElicitResult(action="accept", content={"name": "Alan"})
            forged = await client.session.call_tool(
                "pair", {}, request_state="1.forged", input_responses={"0": alan}, allow_input_required=True
            )
            assert isinstance(forged, types.CallToolResult) and forged.is_error
        pair = Answers("Ada", "Alan")
        text, failed, result = await greet_with(f"{url}/mcp/survey", "pair", pair)
        assert (text, failed, pair.asked) == ("Ada and Alan", False, ["First name?", "Second name?"])
        assert match_of(result)["status"] == "exact"
        text, failed, _ = await greet_with(f"{url}/mcp/survey", "pair", Answers("Ada", "Bob"))
        assert failed and "otherwise" in text and '"Bob"' in text
    store.close()


def _survey(path: Path) -> Store:
    """A store whose one call asked the client two questions (first and second name)."""
    store = Store(path)
    store.put_server(ServerRecord("survey", {"name": "survey", "version": "1"}, {"tools": {}}, "2025-11-25"))
    tool = {"name": "pair", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    store.put_listing("survey", "tools/list", {"tools": [tool]})
    questions = [_asks("First name?", "Ada"), _asks("Second name?", "Alan")]
    store.record_call(
        "survey",
        "tools/call",
        {"name": "pair", "arguments": {}},
        result=text_result("Ada and Alan"),
        notifications=questions,
    )
    return store


@pytest.mark.anyio
async def test_a_request_state_from_another_episode_cannot_skip_a_question(tmp_path: Path) -> None:
    store = _survey(tmp_path / "r.db")
    replay = Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))
    ada = types.ElicitResult(action="accept", content={"name": "Ada"})
    alan = types.ElicitResult(action="accept", content={"name": "Alan"})
    with serving_in_thread(create_app(replay)) as url:
        async with Client(
            f"{url}/episodes/ep-a/mcp/survey", cache=None, elicitation_callback=Answers()
        ) as client:
            first = await client.session.call_tool("pair", {}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult)
            second = await client.session.call_tool(
                "pair",
                {},
                request_state=first.request_state,
                input_responses={"0": ada},
                allow_input_required=True,
            )
            assert isinstance(second, types.InputRequiredResult) and second.request_state
        # Episode B brings A's state (one question answered) and answers only the second question.
        async with Client(
            f"{url}/episodes/ep-b/mcp/survey", cache=None, elicitation_callback=Answers()
        ) as client:
            skipped = await client.session.call_tool(
                "pair",
                {},
                request_state=second.request_state,
                input_responses={"0": alan},
                allow_input_required=True,
            )
            assert isinstance(skipped, types.CallToolResult) and skipped.is_error, skipped
            assert match_of(skipped.model_dump(by_alias=True))["status"] == "miss"
        # In A itself the state is good.
        async with Client(
            f"{url}/episodes/ep-a/mcp/survey", cache=None, elicitation_callback=Answers()
        ) as client:
            done = await client.session.call_tool(
                "pair",
                {},
                request_state=second.request_state,
                input_responses={"0": alan},
                allow_input_required=True,
            )
            assert isinstance(done, types.CallToolResult) and not done.is_error, done
    store.close()


@pytest.mark.parametrize(
    "state",
    [
        "\u0663.0123456789abcdef01234567",
        "\u00b2.0123456789abcdef01234567",
        "01.x",
        7,
        None,
        {"a": 1},
        "1." + "f" * 24,
    ],
    ids=[
        "arabic-indic digit",
        "superscript two",
        "leading zero",
        "a number",
        "null",
        "an object",
        "unsigned",
    ],
)
def test_a_request_state_not_exactly_ours_counts_as_no_question_answered(tmp_path: Path, state: Any) -> None:
    store = _survey(tmp_path / "r.db")
    replay = Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))
    recording = store.recordings(server="survey")[0]
    asked = replay.rounds.next(recording, {"requestState": state}, "episode ep-a\0key")
    assert isinstance(asked, dict) and asked["inputRequests"]["0"]["params"]["message"] == "First name?"
    store.close()


def test_a_request_state_is_bound_to_its_call(tmp_path: Path) -> None:
    store = _survey(tmp_path / "r.db")
    replay = Replay(store, resolver=Resolver(store, index_dir=None, semantic=False))
    recording = store.recordings(server="survey")[0]
    ada = {"0": {"action": "accept", "content": {"name": "Ada"}}}
    first = replay.rounds.next(recording, {"inputResponses": ada}, "episode ep-a\0call-1")
    assert isinstance(first, dict)
    state = first["requestState"]
    assert replay.rounds.answered(recording, state, "episode ep-a\0call-1") == 1
    assert replay.rounds.answered(recording, state, "episode ep-a\0call-2") == 0
    assert replay.rounds.answered(recording, state, "episode ep-b\0call-1") == 0
    store.close()
