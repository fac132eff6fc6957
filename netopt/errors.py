"""netopt's error tree.

Every failure a user can see is one of these. Third-party exceptions (aiohttp,
yaml, OSError from sockets and subprocesses) are turned into one of them at the
edge where they enter netopt, so callers catch netopt's errors only.

    NetoptError                      exit code 1 unless said otherwise
    ├── UsageError                   exit code 2: bad arguments or bad input
    │   ├── ConfigError              a YAML file or an override is wrong
    │   └── ValidationError          a value (name, path, request field) is refused
    │       └── PathTraversalError   a name or path escapes its root
    ├── PermissionDeniedError        exit code 2: needs a privilege (CAP_NET_ADMIN, root)
    ├── DependencyError              a required tool or compiled extension is missing
    ├── NetworkError                 a peer could not be reached or answered badly
    │   ├── PeerUnreachableError     connect/probe timed out or was refused
    │   └── ProtocolError            the peer spoke, but not what we expected
    ├── TlsError                     a TLS peer was refused (not retried), or a downgrade
    ├── AuthenticationError          a token or HMAC tag was refused
    ├── NotFoundError                a named thing (a node, a link) is not known here
    ├── IntegrityError               data failed its hash check
    ├── DatasetChangedError          the origin published a new version during a sync
    ├── ResidencyError               exit code 2: a dataset may not be placed in this region
    ├── StorageError                 a disk operation failed (full disk, I/O error)
    └── LabError                     building or driving the emulated lab failed
"""

from __future__ import annotations

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "AuthenticationError",
    "ConfigError",
    "DatasetChangedError",
    "DependencyError",
    "IntegrityError",
    "LabError",
    "NetoptError",
    "NetworkError",
    "NotFoundError",
    "PathTraversalError",
    "PeerUnreachableError",
    "PermissionDeniedError",
    "ProtocolError",
    "ResidencyError",
    "StorageError",
    "TlsError",
    "UsageError",
    "ValidationError",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class NetoptError(Exception):
    """Base of every error netopt raises on purpose."""

    exit_code: int = EXIT_FAILURE

    def to_dict(self) -> dict[str, object]:
        """The error as JSON-able data, for `--json` output and HTTP bodies."""
        return {"error": type(self).__name__, "message": str(self)}


class UsageError(NetoptError):
    """Bad arguments or bad input: the user can fix it by changing what they gave."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A configuration file (or an environment override) is invalid.

    `file` is the path, `key_path` the dotted location inside it (``links[0].rate_mbps``),
    `expected` what the key should hold and `line` the 1-based line where known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key_path: str = "",
        expected: str | None = None,
        line: int | None = None,
    ) -> None:
        self.file = file
        self.key_path = key_path
        self.expected = expected
        self.line = line
        self.detail = message
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.file or "<config>"
        if self.line is not None:
            where += f":{self.line}"
        key = f" key '{self.key_path}'" if self.key_path else ""
        text = f"{where}:{key} {self.detail}"
        if self.expected:
            text += f" (expected {self.expected})"
        return text

    def to_dict(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "message": str(self),
            "file": self.file,
            "key": self.key_path,
            "expected": self.expected,
            "line": self.line,
        }


class ValidationError(UsageError):
    """A single value was refused (a dataset name, a node name, a request field)."""


class PathTraversalError(ValidationError):
    """A name or relative path would escape the directory it must stay in."""


class PermissionDeniedError(NetoptError):
    """The operation needs a privilege this process lacks (for example CAP_NET_ADMIN)."""

    exit_code = EXIT_USAGE


class DependencyError(NetoptError):
    """A required external tool or compiled extension is missing or unusable."""


class NetworkError(NetoptError):
    """A network operation failed."""


class PeerUnreachableError(NetworkError):
    """A peer did not answer within its timeout, or refused the connection."""


class ProtocolError(NetworkError):
    """A peer answered with something that is not the expected protocol."""


class TlsError(NetoptError):
    """A TLS connection was refused (wrong CA, expired or not-yet-valid certificate, wrong
    host name, missing client certificate) or would fall back to plaintext. Not a
    NetworkError: retrying with the same certificates cannot succeed."""


class AuthenticationError(NetoptError):
    """A token or message authentication tag was missing or wrong."""


class NotFoundError(NetoptError):
    """A named thing (a node, a link) is not known to the service asked (HTTP 404)."""


class IntegrityError(NetoptError):
    """Data did not match its content hash."""


class DatasetChangedError(NetoptError):
    """The origin's files changed while a sync was fetching them: the version the sync
    started on is gone. Not retried as it is: the sync starts again on the new version."""


class ResidencyError(NetoptError):
    """A dataset's residency rule forbids placing it where it was asked to go.

    Exit code 2: a refused request (like a usage error), not a failure to retry.
    """

    exit_code = EXIT_USAGE


class StorageError(NetoptError):
    """A local disk operation failed (no space, I/O error, unwritable directory)."""


class LabError(NetoptError):
    """Building, driving or tearing down the emulated lab failed."""
