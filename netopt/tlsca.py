"""The cluster CA: ``netopt tls init`` makes it, ``netopt tls issue NODE`` signs node certificates.

Keys are ECDSA P-256; a node certificate names the node (its common name and a DNS name)
and the DNS names and IP addresses given, and serves both as a server and a client
certificate (mutual TLS). Renewal is issuing again with ``--force``: the same CA, a new key
and validity window; listeners take the new files within 30 s (`tlsconf.certificate_watch`),
clients at their next connection.

`make_ca` and `issue_cert` are pure (the time is an argument); `write_files` writes every
file atomically with mode 0600 and never overwrites one unless told to; `read_expiry`
reads a certificate's notAfter for ``netopt doctor``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from netopt.errors import StorageError, UsageError, ValidationError
from netopt.fsutil import atomic_write_bytes
from netopt.names import NODE_NAME_RULE, is_node_name

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "IssuedPair",
    "ServerFiles",
    "issue_cert",
    "issue_server_files",
    "load_ca",
    "make_ca",
    "node_files",
    "read_expiry",
    "read_pair",
    "write_files",
]

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
CA_DAYS = 3650
NODE_DAYS = 365
_BACKDATE = dt.timedelta(minutes=5)
"""Clocks of a cluster differ a little: a fresh certificate is valid from a bit earlier."""


@dataclass(frozen=True)
class IssuedPair:
    """A certificate and its private key, PEM."""

    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(name: str, now: dt.datetime, days: int = CA_DAYS) -> IssuedPair:
    """A self-signed CA certificate ``name`` valid ``days`` from ``now`` (UTC)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return IssuedPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def load_ca(ca: IssuedPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Parse the CA's PEM files; ValidationError if they are not a CA and its EC key."""
    try:
        cert = x509.load_pem_x509_certificate(ca.cert_pem)
        key = serialization.load_pem_private_key(ca.key_pem, password=None)
    except ValueError as exc:
        raise ValidationError(f"the CA files are not PEM certificate and key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValidationError("the CA key is not an ECDSA key")
    return cert, key


def issue_cert(
    ca: IssuedPair,
    node: str,
    now: dt.datetime,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    days: int = NODE_DAYS,
) -> IssuedPair:
    """A certificate for ``node`` signed by ``ca``, naming ``node``, ``dns`` and ``ips``
    (server and client use), valid ``days`` from ``now``; ValidationError for a bad name."""
    if not is_node_name(node):
        raise ValidationError(f"node name {node!r} is not allowed ({NODE_NAME_RULE})")
    try:
        addresses = [ipaddress.ip_address(ip) for ip in ips]
    except ValueError as exc:
        raise ValidationError(f"--ip: {exc}") from None
    for name in dns:
        if not name or len(name) > 253 or any(c.isspace() or c in "/\\@" for c in name):
            raise ValidationError(f"--dns {name!r} is not a DNS name")
    ca_cert, ca_key = load_ca(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys([node, *dns])]
    names += [x509.IPAddress(a) for a in addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return IssuedPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def node_files(directory: Path, node: str) -> tuple[Path, Path]:
    """Where ``node``'s certificate and key live in ``directory``."""
    return directory / f"{node}.pem", directory / f"{node}-key.pem"


def write_files(files: dict[Path, bytes], *, force: bool) -> None:
    """Write each file atomically with mode 0600; UsageError, before writing any, when one
    exists and not ``force``."""
    existing = [str(path) for path in files if path.exists()]
    if existing and not force:
        raise UsageError(f"{', '.join(existing)} already exist(s); --force replaces them")
    for path in files:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create {path.parent}: {exc.strerror}") from exc
    for path, data in files.items():
        atomic_write_bytes(path, data, mode=0o600)


@dataclass(frozen=True)
class ServerFiles:
    """Where `issue_server_files` wrote a CA certificate and one node's pair."""

    ca_cert: Path
    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        """The listener's options (``netopt serve``, agent, coordinator)."""
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]

    def client_args(self) -> list[str]:
        """A client's option to verify that listener."""
        return ["--tls-ca", str(self.ca_cert)]


def issue_server_files(
    directory: Path, node: str, *, ips: Sequence[str] = (), dns: Sequence[str] = ()
) -> ServerFiles:
    """A new throwaway CA and ``node``'s certificate for ``ips``/``dns``, written into
    ``directory`` (the CA key is not kept): what benchmarks and tests run their
    servers with, so they run with TLS on as users do."""
    now = dt.datetime.now(dt.UTC)
    ca = make_ca(f"{node} throwaway CA", now, days=30)
    pair = issue_cert(ca, node, now, dns=list(dns), ips=list(ips), days=30)
    cert, key = node_files(directory, node)
    ca_cert = directory / CA_CERT
    write_files({ca_cert: ca.cert_pem, cert: pair.cert_pem, key: pair.key_pem}, force=False)
    return ServerFiles(ca_cert, cert, key)


def read_pair(cert_file: Path, key_file: Path) -> IssuedPair:
    """Read a certificate and key from disk; UsageError naming the file that is missing."""
    try:
        return IssuedPair(cert_file.read_bytes(), key_file.read_bytes())
    except OSError as exc:
        raise UsageError(
            f"cannot read {exc.filename}: {exc.strerror} (run netopt tls init first?)"
        ) from None


def read_expiry(cert_file: str | os.PathLike[str]) -> dt.datetime:
    """A PEM certificate's notAfter (UTC); ValidationError naming the file when unreadable."""
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValidationError(f"cannot read certificate {cert_file}: {reason}") from None
    return cert.not_valid_after_utc
