"""What stands between the network and the engine: `ServeConfig` and the `Guard` middleware.

Before a request reaches a handler, `Guard` checks, in this order, and answers in OpenAI's error shape:
    Host header     one of `allowed_hosts` (a web page cannot reach a loopback server by DNS rebinding)  400
    API key         `Authorization: Bearer <api_key>` when a key is set (as `vllm serve --api-key`)       401
    body size       at most `max_body_bytes`, refused before it is read or parsed                          413
    concurrency     at most `limit_concurrency` open /v1 requests                                          503
`/health` needs no key, so a load balancer can probe it; `/metrics` and `/docs` do.
"""
from __future__ import annotations

import hmac
import json
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .protocol import OpenAIError

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
OPEN_PATHS = ("/health",)


@dataclass(frozen=True)
class ServeConfig:
    """How much the server accepts and from whom.

    api_key: required as a Bearer token on every path but /health (None: no key).
    allowed_hosts: Host header names accepted (("*",): any).
    max_body_bytes: largest request body; a larger one is a 413.
    limit_concurrency: most /v1 requests open at once; more get a 503 (None: no limit).
    request_timeout: seconds a request may run before it is aborted (None: no deadline).
    """

    api_key: str | None = None
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    max_body_bytes: int = 1 << 20
    limit_concurrency: int | None = None
    request_timeout: float | None = None

    @staticmethod
    def hosts_for(bind_host: str) -> tuple[str, ...]:
        """Default allowed Host names for a server bound to `bind_host`: loopback names plus the bind
        address; any name when it binds every interface (the server is open to the network anyway)."""
        if bind_host in WILDCARD_BINDS:
            return ("*",)
        host = f"[{bind_host}]" if ":" in bind_host else bind_host
        return tuple(dict.fromkeys((*LOOPBACK_HOSTS, host.lower())))


class BodyTooLarge(Exception):
    """A body sent without Content-Length grew past the limit while it was read."""


async def send_error(send: Send, error: OpenAIError, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer with `error` and close the connection, without reading the request's body."""
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


def host_name(header: str) -> str:
    """The Host header without its port: "127.0.0.1:8000" -> "127.0.0.1", "[::1]:80" -> "[::1]"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[:header.find("]") + 1]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """Pure ASGI middleware applying a `ServeConfig` (pure ASGI so a refused body is never read)."""

    def __init__(self, app: ASGIApp, config: ServeConfig):
        self.app, self.config = app, config
        self.open_requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cfg, path = self.config, scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if "*" not in cfg.allowed_hosts and host_name(headers.get("host", "")) not in cfg.allowed_hosts:
            return await send_error(send, OpenAIError(
                f"invalid Host header {headers.get('host', '')!r}: this server answers to "
                f"{', '.join(cfg.allowed_hosts)} (start it with --allowed-hosts to add names)", code="invalid_host"))
        if cfg.api_key is not None and path not in OPEN_PATHS and not hmac.compare_digest(
                headers.get("authorization", "").encode(), f"Bearer {cfg.api_key}".encode()):
            return await send_error(send, OpenAIError(
                "incorrect or missing API key: send it as 'Authorization: Bearer <key>'", status=401,
                code="invalid_api_key"), [(b"www-authenticate", b"Bearer")])
        length = headers.get("content-length", "0")
        if not length.isdigit() or int(length) > cfg.max_body_bytes:
            return await send_error(send, too_large(cfg.max_body_bytes))
        limited = cfg.limit_concurrency is not None and path.startswith("/v1/")
        if limited and self.open_requests >= cfg.limit_concurrency:
            return await send_error(send, OpenAIError(
                f"the server is at its limit of {cfg.limit_concurrency} open requests (--limit-concurrency); "
                "retry later", status=503, type="server_error", code="too_many_requests"))
        self.open_requests += limited
        try:
            await self.app(scope, self._counting(receive), send)
        finally:
            self.open_requests -= limited

    def _counting(self, receive: Receive) -> Receive:
        """`receive`, raising `BodyTooLarge` once a chunked body passes the limit."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.config.max_body_bytes:
                    raise BodyTooLarge()
            return message
        return counted


def too_large(limit: int) -> OpenAIError:
    return OpenAIError(f"the request body is larger than this server accepts ({limit} bytes; --max-body-bytes)",
                       status=413, code="request_too_large")
