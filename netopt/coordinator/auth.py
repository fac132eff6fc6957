"""Which coordinator paths need the token; the check itself is ``webshell.check_bearer``."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from netopt.webshell import check_bearer

__all__ = ["PUBLIC_PATHS", "token_middleware"]

PUBLIC_PATHS = frozenset(
    {"/", "/dashboard.js", "/dashboard.css", "/openapi.json", "/healthz", "/readyz"}
)
"""Paths served without a token: the static dashboard shell, the API description, liveness and
readiness (probed by orchestrators without the secret)."""


def token_middleware(token: str) -> Middleware:
    """A middleware refusing every non-public request without the shared ``token``."""
    secret = token.encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS:
            check_bearer(request.headers.get("Authorization"), secret)
        return await handler(request)

    return middleware
