"""Bearer-token authentication for the coordinator's API (constant-time compare)."""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from netopt.errors import AuthenticationError

__all__ = ["PUBLIC_PATHS", "check_bearer", "token_middleware"]

PUBLIC_PATHS = frozenset({"/", "/dashboard.js", "/dashboard.css", "/openapi.json", "/healthz"})
"""Paths served without a token: the static dashboard shell, the API description, liveness."""


def check_bearer(header: str | None, token: bytes) -> None:
    """Raise AuthenticationError unless ``header`` is ``Bearer <token>``."""
    if not header:
        raise AuthenticationError("missing Authorization: Bearer token")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise AuthenticationError("Authorization must use the Bearer scheme")
    if not hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token):
        raise AuthenticationError("token refused")


def token_middleware(token: str) -> Middleware:
    """A middleware refusing every non-public request without the shared ``token``."""
    secret = token.encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS:
            check_bearer(request.headers.get("Authorization"), secret)
        return await handler(request)

    return middleware
