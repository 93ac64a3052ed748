"""Running the replay app on a buffered request: an answered request is never cancelled in its tail."""

from __future__ import annotations

from typing import Any

import anyio

from replay_sim.scale.wire import run_buffered


def test_a_consumer_cancelled_after_the_answer_leaves_the_app_to_finish_and_one_mid_answer_stops_it() -> None:
    finished: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": scope["path"] == "/stream"})
        try:
            await anyio.sleep(0.2)  # what the SDK settles after answering (keeping a new session)
            finished.append(scope["path"])
        except BaseException:
            finished.append(f"cancelled {scope['path']}")
            raise

    async def consume(path: str) -> list[list[dict[str, Any]]]:
        batches = []
        with anyio.CancelScope() as scope:
            async for batch in run_buffered(app, {"type": "http", "method": "POST", "path": path}, b"{}"):
                batches.append(batch)
                if batches[-1][-1]["type"] == "http.response.body":
                    scope.cancel()  # the client closes as soon as it has the body
        return batches

    async def run() -> None:
        answered = await consume("/answered")
        assert [m["type"] for m in answered[0]] == ["http.response.start", "http.response.body"]
        await consume("/stream")
        with anyio.fail_after(5):
            while len(finished) < 2:
                await anyio.sleep(0.01)

    anyio.run(run)
    assert sorted(finished) == ["/answered", "cancelled /stream"]
