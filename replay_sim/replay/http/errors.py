"""Every error of the admin API is JSON with its status: ``{"detail": ..., "status": N}``.

FastAPI answers its own refusals (``HTTPException``, a query that does not validate) with
``{"detail": ...}``; anything else an endpoint raises — a corrupt row the store names, a store
another process holds locked — would be Starlette's bare ``500 Internal Server Error`` in plain
text. :func:`json_errors` gives them all one shape, so a client reads every failure the same way:

- an ``HTTPException`` keeps its status and headers; a request that does not validate is ``422``
  with FastAPI's list of problems as ``detail``;
- :class:`~replay_sim.errors.EpisodeError` has its own status; a store locked by another writer is
  ``503`` with ``Retry-After``; any other :class:`~replay_sim.errors.ReplaySimError` (a corrupt
  recording, an unreadable store) is ``500`` with its message, which names the thing and what to do;
- anything else is ``500`` saying the server failed (the traceback goes to the log, not the client).
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from replay_sim.errors import EpisodeError, ReplaySimError, StoreLockedError

__all__ = ["error_response", "json_errors"]


def error_response(status: int, detail: object, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The admin API's error answer: ``{"detail": detail, "status": status}`` with ``status``."""
    return JSONResponse({"detail": jsonable_encoder(detail), "status": status}, status, headers=headers)


def json_errors(app: FastAPI) -> None:
    """Answer every error of ``app`` as JSON with its status (see the module's docstring).

    Args:
        app: The admin app.
    """

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, exc.detail, exc.headers)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, exc.errors())

    async def replay_sim_error(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, EpisodeError):
            retry = {"Retry-After": "1"} if exc.status == 503 else None
            return error_response(exc.status, str(exc), retry)
        if isinstance(exc, StoreLockedError):
            return error_response(503, str(exc), {"Retry-After": "1"})
        return error_response(500, str(exc))

    async def failed(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback; the client learns only that the server failed.
        return error_response(
            500, f"the replay server failed answering {request.url.path}: {type(exc).__name__}"
        )

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(ReplaySimError, replay_sim_error)
    app.add_exception_handler(Exception, failed)
