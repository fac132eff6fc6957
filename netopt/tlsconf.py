"""TLS for every netopt listener and client: SSL contexts from files, and the plaintext rules.

Both ends speak TLS 1.2 or later, and TLS 1.2 only with `TLS12_CIPHERS` (AEAD suites with
ECDHE key exchange: no CBC, no static RSA); TLS 1.3's suites are all AEAD (Python 3.11 cannot
reorder them: OpenSSL's order, AES-256-GCM first, is what two netopt ends agree on).

Servers: `server_context(ServerTls)` builds the listener's context (TLS 1.2 or later; with
``require_client_cert`` a peer must present a certificate the cluster CA signed: mutual
TLS). `certificate_watch` takes a renewed certificate and key into a running listener's
context. `check_listener` refuses a plaintext listener on a non-loopback address unless the
service was told ``allow_plaintext``.

Clients: the command line (``--tls-ca/--tls-cert/--tls-key/--insecure``) or the agent (its
``tls:`` section, ``insecure`` for its clients apart from the listener's ``allow_plaintext``)
sets the process's `ClientTls` once with `use_client_tls`; every client
asks `client_ssl(url, sends_token=...)` where it opens a connection. The rules, in one home:

- ``https://`` is verified against the cluster CA when one is set (the system's CAs
  otherwise), with host-name checking; a client certificate is sent when one is set;
- ``netopt://HOST:PORT/NAME`` (the data plane) speaks TLS exactly when a CA is set
  (`data_scheme`), so a cluster with TLS on never falls back to plaintext;
- ``http://`` while a CA is set is a downgrade and is refused;
- a bearer token over plain ``http://`` to a non-loopback host is refused unless
  ``insecure`` (then one warning per process).

`explain_tls_failure` turns the ssl module's failures (found in an exception's chain) into
one sentence naming the cause: unknown CA, expired, not yet valid, wrong host name, a
missing client certificate, a peer that does not speak TLS.
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from netopt.errors import ConfigError, TlsError, UsageError

__all__ = [
    "RELOAD_INTERVAL_S",
    "TLS12_CIPHERS",
    "ClientTls",
    "ServerTls",
    "certificate_watch",
    "check_listener",
    "client_context",
    "client_ssl",
    "current_client_tls",
    "data_scheme",
    "disconnect_hint",
    "explain_tls_failure",
    "is_loopback",
    "listener_context",
    "section_client_tls",
    "server_context",
    "use_client_tls",
]

log = logging.getLogger(__name__)

TLS12_CIPHERS = "@SECLEVEL=2:ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL"
"""The suites both ends allow under TLS 1.2: AES-GCM (AES-NI) before ChaCha20-Poly1305,
both with ECDHE; a peer that offers only CBC or static-RSA suites is refused."""


def _restrict(ctx: ssl.SSLContext) -> None:
    """TLS 1.2 or later, and under 1.2 only `TLS12_CIPHERS`."""
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)


@dataclass(frozen=True)
class ServerTls:
    """A listener's certificate, key and (for mutual TLS) the CA its clients must chain to."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    require_client_cert: bool = False
    where: str = "--tls-cert"
    """Where the files were named (a config file, an option): errors point there."""


@dataclass(frozen=True)
class ClientTls:
    """How this process's clients speak TLS. ``ca_file`` None: TLS only for https://."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    """Allow sending the token over plain HTTP to a non-loopback host (warned once)."""
    where: str = "--tls-ca"

    @property
    def enabled(self) -> bool:
        return self.ca_file is not None


_CLIENT_TLS: contextvars.ContextVar[ClientTls] = contextvars.ContextVar(
    "netopt_client_tls",
    default=ClientTls(),  # noqa: B039 - frozen
)
_warned_insecure: set[str] = set()
_contexts: dict[tuple[object, ...], ssl.SSLContext] = {}


def use_client_tls(tls: ClientTls) -> None:
    """Set how clients in this context (and the tasks it starts) speak TLS."""
    if (tls.cert_file is None) != (tls.key_file is None):
        raise UsageError(f"{tls.where}: a client certificate needs both its cert and key")
    _CLIENT_TLS.set(tls)


def current_client_tls() -> ClientTls:
    return _CLIENT_TLS.get()


def data_scheme() -> str:
    """``https`` when the cluster CA is set (the data plane speaks TLS), else ``http``."""
    return "https" if current_client_tls().enabled else "http"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; False for every other name or address."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _file_error(path: str, where: str, what: str, exc: BaseException) -> ConfigError:
    reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
    return ConfigError(f"cannot load {what} {path}: {reason}", file=where, expected=what)


def _load_ca(ctx: ssl.SSLContext, ca_file: str, where: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise _file_error(ca_file, where, "a PEM CA certificate", exc) from None


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str, where: str) -> None:
    for path in (cert_file, key_file):
        if not os.path.isfile(path):
            raise ConfigError(f"{path} does not exist", file=where, expected="a PEM file")
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise _file_error(
            f"{cert_file} with key {key_file}", where, "a PEM certificate and its key", exc
        ) from None


def _mtimes(*paths: str | None) -> tuple[object, ...]:
    out: list[object] = []
    for path in paths:
        try:
            # The inode too: a renewal renames new files into place (a new inode even
            # where the clock's granularity gives the same mtime).
            stat = os.stat(path) if path else None
            out.append((path, stat.st_ino, stat.st_mtime_ns) if stat else None)
        except OSError:
            out.append((path, None))
    return tuple(out)


def server_context(tls: ServerTls) -> ssl.SSLContext:
    """The listener's context; ConfigError naming the file that cannot be loaded."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _restrict(ctx)  # the server's order decides (OP_CIPHER_SERVER_PREFERENCE, ssl's default)
    _load_chain(ctx, tls.cert_file, tls.key_file, tls.where)
    if tls.require_client_cert:
        if tls.ca_file is None:
            raise ConfigError(
                "require_client_cert is set without a CA",
                file=tls.where,
                expected="tls.ca: the cluster CA that signs client certificates",
            )
        ctx.verify_mode = ssl.CERT_REQUIRED
    if tls.ca_file is not None:
        _load_ca(ctx, tls.ca_file, tls.where)
        if not tls.require_client_cert:
            ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(tls: ClientTls) -> ssl.SSLContext:
    """A verifying client context (host names checked); rebuilt when a file changes, so a
    renewed certificate is used by the next connection."""
    key = _mtimes(tls.ca_file, tls.cert_file, tls.key_file)
    cached = _contexts.get(key)
    if cached is not None:
        return cached
    if tls.ca_file is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_ca(ctx, tls.ca_file, tls.where)
    else:
        ctx = ssl.create_default_context()
    _restrict(ctx)
    if tls.cert_file is not None and tls.key_file is not None:
        _load_chain(ctx, tls.cert_file, tls.key_file, tls.where)
    _contexts.clear()  # one live set of files per process
    _contexts[key] = ctx
    return ctx


def client_ssl(url: str, *, sends_token: bool) -> ssl.SSLContext | None:
    """The context to reach ``url`` with (None: plain HTTP), after the plaintext rules.

    Raises TlsError for http:// while TLS is configured (a downgrade) and UsageError for a
    token over plain HTTP to a non-loopback host without ``insecure``.
    """
    tls = current_client_tls()
    parts = urlsplit(url)
    if parts.scheme == "https":
        return client_context(tls)
    host = parts.hostname or ""
    if tls.enabled:
        raise TlsError(
            f"{url}: plain http:// while TLS is configured ({tls.where}); use https:// "
            "(netopt:// speaks TLS by itself)"
        )
    if sends_token and not is_loopback(host):
        if not tls.insecure:
            raise UsageError(
                f"refusing to send the token in plaintext to {host} ({url}): give the "
                "cluster CA with --tls-ca (https://, TLS on netopt://), or --insecure "
                "(an agent config's tls.insecure)"
            )
        if host not in _warned_insecure:
            _warned_insecure.add(host)
            log.warning("--insecure: the token goes to %s in plaintext", host)
    return None


def check_listener(host: str, tls_on: bool, allow_plaintext: bool, where: str) -> None:
    """Refuse a plaintext listener on a non-loopback address unless explicitly allowed."""
    if tls_on or allow_plaintext or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to listen in plaintext on {host}, a non-loopback address",
        file=where,
        expected="tls.cert and tls.key (--tls-cert/--tls-key), or allow_plaintext: true "
        "(--allow-plaintext) on a network you trust",
    )


_VERIFY_CAUSES = {
    9: "the peer's certificate is not yet valid (its notBefore is in the future)",
    10: "the peer's certificate has expired",
    18: "the peer's certificate is self-signed, not signed by the cluster CA",
    19: "the peer's certificate chain ends in a CA this side does not trust (wrong CA)",
    20: "the peer's certificate is not signed by the CA this side trusts (wrong CA)",
    21: "the peer's certificate is not signed by the CA this side trusts (wrong CA)",
    62: "the peer's certificate does not name the host connected to (wrong host name)",
    64: "the peer's certificate does not name the address connected to (wrong host name)",
}
_REASON_CAUSES = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires a client certificate "
    "(mutual TLS): give --tls-cert and --tls-key",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "the server refused the handshake (a client "
    "certificate may be required: --tls-cert and --tls-key)",
    "WRONG_VERSION_NUMBER": "the peer does not speak TLS (a plain HTTP server?)",
    "HTTP_REQUEST": "plain HTTP was sent to a TLS server",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the server refused this side's client certificate",
    "TLSV1_ALERT_UNKNOWN_CA": "the server does not trust the CA of this side's client certificate",
    "CERTIFICATE_VERIFY_FAILED": "the peer's certificate failed verification",
    "UNSUPPORTED_PROTOCOL": "the peer offers only TLS versions below 1.2",
    "NO_SHARED_CIPHER": "the peer offers no cipher suite this side allows (TLS 1.2: "
    "AEAD with ECDHE only)",
}


def disconnect_hint(url: str) -> tuple[str, bool]:
    """Why a server at ``url`` may have closed the connection without answering, and
    whether that is a TLS refusal for sure enough to stop retrying: a TLS server closes
    plain HTTP; under TLS 1.3 a server requiring a client certificate this side does not
    have sends its alert after the handshake, which reaches aiohttp as a disconnect."""
    if urlsplit(url).scheme != "https":
        return "a TLS server closes plain HTTP: use https:// and --tls-ca", False
    if current_client_tls().cert_file is None:
        return (
            "the server requires a client certificate (mutual TLS): give --tls-cert and --tls-key",
            True,
        )
    return "the server may have refused this side's client certificate", False


def explain_tls_failure(exc: BaseException) -> str | None:
    """One sentence naming why a TLS connection failed, from ``exc`` or its chain; None
    when no ssl failure is in it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # aiohttp's wrappers subclass the ssl errors without their fields: look inside first.
        inner = (getattr(current, "certificate_error", None), getattr(current, "os_error", None))
        for candidate in (*inner, current):
            if isinstance(candidate, ssl.SSLCertVerificationError):
                code = getattr(candidate, "verify_code", None)
                if code is None:
                    continue
                cause = _VERIFY_CAUSES.get(code)
                message = getattr(candidate, "verify_message", "")
                return cause or f"certificate verification failed: {message}"
            if isinstance(candidate, ssl.SSLError):
                reason = getattr(candidate, "reason", None)
                if reason is None and candidate is current and any(inner):
                    continue
                return _REASON_CAUSES.get(reason or "", f"TLS failed: {reason or candidate}")
        current = current.__cause__ or current.__context__
    return None


class TlsSection(Protocol):
    """A config file's ``tls:`` section (`netopt.config.TlsSettings`)."""

    @property
    def cert(self) -> str | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def ca(self) -> str | None: ...
    @property
    def require_client_cert(self) -> bool: ...
    @property
    def allow_plaintext(self) -> bool: ...
    @property
    def insecure(self) -> bool: ...


RELOAD_INTERVAL_S = 30.0
"""How often a TLS listener looks for a renewed certificate and key."""


def reload_if_changed(ctx: ssl.SSLContext, section: TlsSection, seen: object, where: str) -> object:
    """Load ``section``'s cert and key into ``ctx`` again when their mtimes are not ``seen``
    (new handshakes then use them); the mtimes now loaded. A pair that does not load (a
    renewal half-way: the key renamed, the certificate not yet) keeps the old one."""
    if section.cert is None or section.key is None:
        return seen
    now = _mtimes(section.cert, section.key)
    if now == seen:
        return seen
    try:
        _load_chain(ctx, section.cert, section.key, where)
    except ConfigError as exc:
        log.warning("%s; the loaded certificate stays in use", exc)
        return seen
    log.warning("%s: loaded the renewed certificate %s", where, section.cert)
    return now


async def certificate_watch(
    ctx: ssl.SSLContext | None,
    section: TlsSection,
    where: str,
    interval_s: float = RELOAD_INTERVAL_S,
) -> None:
    """Until cancelled: every ``interval_s``, take a renewed certificate into ``ctx``
    (renewal while running: ``netopt tls renew`` needs no restart)."""
    import asyncio  # here: the CLI's clients import this module before asyncio is needed

    if ctx is None or section.cert is None or section.key is None:
        return
    seen: object = _mtimes(section.cert, section.key)
    while True:
        await asyncio.sleep(interval_s)
        seen = reload_if_changed(ctx, section, seen, where)


def listener_context(section: TlsSection, host: str, where: str) -> ssl.SSLContext | None:
    """A service's listening context from its ``tls:`` section (None: plaintext, allowed
    only on loopback or with ``allow_plaintext``); ConfigError naming what is wrong."""
    if section.cert is None or section.key is None:
        check_listener(host, False, section.allow_plaintext, where)
        return None
    return server_context(
        ServerTls(section.cert, section.key, section.ca, section.require_client_cert, where)
    )


def section_client_tls(section: TlsSection, where: str) -> ClientTls:
    """How a service's own clients (the agent's reporter, region sharing) speak TLS."""
    return ClientTls(
        ca_file=section.ca,
        cert_file=section.cert,
        key_file=section.key,
        insecure=section.insecure,
        where=where,
    )
