"""What a request may ask of the server: its body size, a turn at the models (a few at once, a
short queue, then 503), the bearer token, and one log line per request. Pure ASGI middleware."""

from __future__ import annotations

import contextlib
import hmac
import json
import time

import anyio

from charlm.logs import get_logger


class Busy(Exception):
    """Every turn is taken and the queue is full."""


class Gate:
    """``concurrency`` requests compute at once, ``queue`` more wait; ``admit`` refuses the rest."""

    def __init__(self, concurrency: int, queue: int):
        self.concurrency, self.capacity = concurrency, concurrency + queue
        self.admitted = 0  # computing or waiting
        self._slots: anyio.Semaphore | None = None

    def admit(self) -> None:
        if self.admitted >= self.capacity:
            raise Busy(
                f"the server is busy: {self.concurrency} requests computing and {self.capacity - self.concurrency} "
                "waiting; try again shortly"
            )
        self.admitted += 1

    def leave(self) -> None:
        self.admitted -= 1

    @contextlib.asynccontextmanager
    async def turn(self):
        """Wait for one of the ``concurrency`` slots (an admitted request only)."""
        if self._slots is None:
            self._slots = anyio.Semaphore(self.concurrency)
        async with self._slots:
            yield


async def send_error(send, status: int, message: str, headers: dict | None = None) -> None:
    """A JSON error ``{"error": "one line"}`` as a whole response."""
    body = json.dumps({"error": " ".join(message.split())}).encode("utf-8")
    extra = [(key.lower().encode(), value.encode()) for key, value in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: logs each request in one line, checks the bearer token of /v1 requests and
    reads at most ``max_body`` bytes of a body before the application sees any of it."""

    def __init__(self, app, max_body: int, api_key: str | None = None):
        self.app, self.max_body, self.api_key = app, max_body, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [0]

        async def record(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._checked(scope, receive, record)
        finally:
            client = scope.get("client") or ("-", 0)
            get_logger().info(
                f'{client[0]} "{scope["method"]} {scope["path"]}" {status[0] or "-"} '
                f"{(time.perf_counter() - started) * 1000:.0f} ms"
            )

    async def _checked(self, scope, receive, send):
        if self.api_key is not None and scope["path"].startswith("/v1/") and not self._authorised(scope):
            await send_error(
                send,
                401,
                "this server needs an API key: send the header 'Authorization: Bearer KEY'",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            await send_error(
                send, 413, f"the request body is larger than the limit of {self.max_body:,} bytes (--max-body)"
            )
            return
        body, more = b"", scope["method"] in ("POST", "PUT", "PATCH")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                await send_error(
                    send, 413, f"the request body is larger than the limit of {self.max_body:,} bytes (--max-body)"
                )
                return
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _authorised(self, scope) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())
