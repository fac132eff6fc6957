"""Strict readers for JSON request bodies: types, ranges, lengths and unknown keys.

Every refusal is a :class:`RequestInvalid` naming the field path
(``summaries[3].rtt_ms.p50``), so an HTTP 400 body tells the client exactly
what to fix. JSON numbers must be finite; booleans are never numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from netopt.errors import ValidationError

__all__ = ["Reader", "RequestInvalid", "check_number", "parse_json_body", "string_schema"]


class RequestInvalid(ValidationError):
    """A request body was refused; ``field`` is the dotted path of the offending value."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field or 'body'}: {message}" if field else message)

    def to_dict(self) -> dict[str, object]:
        return {"error": type(self).__name__, "message": str(self), "field": self.field}


def parse_json_body(raw: bytes) -> Any:
    """Decode a UTF-8 JSON document; RequestInvalid for bad encoding, syntax, NaN, deep
    nesting or an integer over Python's digit limit."""
    # Imported here: webshell brings aiohttp, and the readers (and the `Nic` the NCCL
    # tuner uses) must not cost `nccl-env --links` or a plan an aiohttp import.
    from netopt.webshell import parse_json_document

    try:
        return parse_json_document(raw)
    except ValidationError as exc:
        raise RequestInvalid("", str(exc)) from None


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class Reader:
    """Reads fields of one JSON object; call :meth:`done` to refuse unknown keys."""

    def __init__(self, data: object, path: str = "", keys: frozenset[str] | None = None) -> None:
        if not isinstance(data, dict):
            raise RequestInvalid(path, f"expected an object, got {_kind(data)}")
        self.data: dict[str, Any] = data
        self.path = path
        # With ``keys`` the unknown-key check happens here, once, and reads are cheap.
        self._keys = keys
        self._seen: set[str] = set()
        if keys is not None and not keys.issuperset(data):
            self._refuse_unknown(set(data) - keys)

    def _get(self, key: str, required: bool) -> Any:
        if self._keys is None:
            self._seen.add(key)
        value = self.data.get(key)
        if value is None and required:
            raise RequestInvalid(_join(self.path, key), "is required")
        return value

    def string(
        self,
        key: str,
        *,
        max_len: int,
        pattern: re.Pattern[str] | None = None,
        required: bool = True,
        choices: tuple[str, ...] = (),
    ) -> Any:
        """A string of 1..max_len characters, matching ``pattern`` / one of ``choices``."""
        value = self._get(key, required)
        if value is None:
            return None
        if (
            type(value) is str
            and 0 < len(value) <= max_len
            and (not choices or value in choices)
            and (pattern is None or pattern.fullmatch(value))
        ):
            return value
        where = _join(self.path, key)
        if not isinstance(value, str):
            raise RequestInvalid(where, f"expected a string, got {_kind(value)}")
        if not 0 < len(value) <= max_len:
            raise RequestInvalid(where, f"length must be 1..{max_len} characters")
        if choices and value not in choices:
            raise RequestInvalid(where, f"must be one of {', '.join(choices)}")
        if pattern is not None and not pattern.fullmatch(value):
            raise RequestInvalid(where, f"{value[:64]!r} does not match {pattern.pattern}")
        return value

    def number(self, key: str, *, ge: float, le: float, required: bool = True) -> Any:
        """A finite number within ``ge..le`` (an int is accepted and returned as float)."""
        value = self._get(key, required)
        if value is None:
            return None
        if type(value) is float and ge <= value <= le:  # the common case, checked cheaply
            return value
        return check_number(value, _join(self.path, key), ge, le)

    def integer(self, key: str, *, ge: int, le: int, required: bool = True) -> Any:
        """An integer within ``ge..le``."""
        value = self._get(key, required)
        if value is None:
            return None
        if type(value) is int and ge <= value <= le:
            return value
        where = _join(self.path, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestInvalid(where, f"expected an integer, got {_kind(value)}")
        raise RequestInvalid(where, f"must be within {ge}..{le}")

    def boolean(self, key: str, *, default: bool) -> bool:
        """A JSON boolean; ``default`` when absent."""
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise RequestInvalid(_join(self.path, key), f"expected a boolean, got {_kind(value)}")
        return value

    def items(
        self, key: str, *, max_items: int, required: bool = True
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(path, item)`` for each element of a list of at most ``max_items``."""
        value = self._get(key, required)
        if value is None:
            return
        where = _join(self.path, key)
        if not isinstance(value, list):
            raise RequestInvalid(where, f"expected a list, got {_kind(value)}")
        if len(value) > max_items:
            raise RequestInvalid(where, f"holds {len(value)} items, at most {max_items} allowed")
        for index, item in enumerate(value):
            yield _join(where, index), item

    def child(
        self, key: str, *, required: bool = True, keys: frozenset[str] | None = None
    ) -> Reader | None:
        """A Reader over a nested object (None when absent and not required)."""
        value = self._get(key, required)
        if value is None:
            return None
        return Reader(value, _join(self.path, key), keys)

    def done(self) -> None:
        """Refuse keys this reader did not ask for (typos must not pass silently).

        A reader made with ``keys`` checked them when it was made.
        """
        if self._keys is None and len(self._seen) < len(self.data):
            unknown = set(self.data) - self._seen
            if unknown:
                self._refuse_unknown(unknown)

    def _refuse_unknown(self, unknown: set[str]) -> None:
        names = ", ".join(repr(k[:40]) for k in sorted(unknown)[:5])
        raise RequestInvalid(self.path, f"unknown key(s) {names}")


def check_number(value: object, where: str, ge: float, le: float) -> float:
    """``value`` as a finite float within ``ge..le``; RequestInvalid otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestInvalid(where, f"expected a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise RequestInvalid(where, "number is too large") from None
    if not math.isfinite(number) or not ge <= number <= le:
        raise RequestInvalid(where, f"must be within {ge:g}..{le:g}")
    return number


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def string_schema(max_len: int, pattern: re.Pattern[str] | None = None) -> dict[str, Any]:
    """The JSON Schema of what :meth:`Reader.string` accepts with the same arguments.

    The OpenAPI document is built from this, so the document and the validation
    share one definition of every string field (``fullmatch`` becomes an anchored
    pattern; Python's and ECMA-262's syntax agree for the classes netopt uses).
    """
    schema: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": max_len}
    if pattern is not None:
        # \Z (Python's end of string, kept so a stray .match cannot pass "name\n") is no
        # ECMA-262 escape: the anchored $ below says the same there.
        body = pattern.pattern.removeprefix("^").removesuffix("$").removesuffix("\\Z")
        schema["pattern"] = f"^(?:{body})$"
    return schema
