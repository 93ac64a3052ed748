"""The stdio door: one recorded server replayed to one client over this process's stdin and stdout."""

from __future__ import annotations

import contextlib
import signal

import anyio

from replay_sim.replay.core.connections import stdio_client
from replay_sim.replay.core.histories import one_client
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.stdio.fastpath import StdioFastPath
from replay_sim.stdio_transport import Resume, native_stdio

__all__ = ["serve_stdio", "serve_stdio_until_signalled"]


async def serve_stdio(replay: Replay, name: str, resume: Resume | None = None) -> None:
    """Replay server ``name`` to one client over this process's stdin/stdout until it hangs up.

    Args:
        replay: The replay answering.
        name: The recorded server.
        resume: The connection as a stdio start left it (:mod:`replay_sim.replay.stdio.start`):
            the requests it answered are served first, their answers not written again.

    Raises:
        ConfigError: No server of that name was recorded.
    """
    server = replay.server(name)
    async with contextlib.AsyncExitStack() as stack:
        await replay.enter(stack)
        replay.resolver.warm(wait=False)  # in the background: exact hits are answered at once
        stack.enter_context(one_client())  # before the stream's tasks start: they inherit it
        client = stack.enter_context(stdio_client())
        fast = StdioFastPath(replay.prepared, name, server, client)
        streams = native_stdio(shortcut=fast, resume=resume)
        read_stream, write_stream = await stack.enter_async_context(streams)
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_stdio_until_signalled(replay: Replay, name: str, resume: Resume | None = None) -> None:
    """:func:`serve_stdio` until the client hangs up, or SIGTERM or SIGHUP arrives: then it ends as
    at hang-up (what the replay holds is closed, queued sandbox answers written) before returning.

    For an entry point (``serve --stdio``): it takes those signals over while it runs.
    """
    async with anyio.create_task_group() as tg:

        async def stop_when_signalled() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_when_signalled)
        await serve_stdio(replay, name, resume)
        tg.cancel_scope.cancel()
