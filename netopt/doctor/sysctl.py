"""Read and write sysctls through ``/proc/sys`` (the caller's network namespace).

Network sysctls such as ``net.ipv4.tcp_rmem`` are per network namespace:
``ip netns exec NS netopt doctor`` sees and changes that namespace's values.
"""

from __future__ import annotations

from pathlib import Path

from netopt.errors import PermissionDeniedError, StorageError, ValidationError

__all__ = ["PROC_SYS", "read_sysctl", "sysctl_path", "write_sysctl"]

PROC_SYS = Path("/proc/sys")


def sysctl_path(name: str, root: Path = PROC_SYS) -> Path:
    """``net.ipv4.tcp_rmem`` -> ``/proc/sys/net/ipv4/tcp_rmem``; ValidationError if odd."""
    parts = name.split(".")
    if not all(p and p not in {".", ".."} and "/" not in p for p in parts):
        raise ValidationError(f"{name!r} is not a sysctl name")
    return root.joinpath(*parts)


def read_sysctl(name: str, root: Path = PROC_SYS) -> str | None:
    """The value as ``sysctl -n`` prints it (whitespace collapsed); None if absent/unreadable."""
    try:
        text = sysctl_path(name, root).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return " ".join(text.split())


def write_sysctl(name: str, value: str, root: Path = PROC_SYS) -> None:
    """Write ``value`` to sysctl ``name``.

    Raises PermissionDeniedError without the privilege (or where the kernel
    refuses it in this namespace), StorageError for any other failure.
    """
    path = sysctl_path(name, root)
    try:
        path.write_text(value + "\n", encoding="ascii")
    except PermissionError as exc:
        raise PermissionDeniedError(f"cannot set {name}: {exc.strerror} (needs root)") from None
    except OSError as exc:
        raise StorageError(f"cannot set {name}={value!r}: {exc.strerror}") from None
