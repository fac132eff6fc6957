"""Turn YAML text into frozen, typed settings dataclasses.

The loader is the one place that reads configuration: it parses YAML while
remembering the line of every key, applies ``NETOPT_*`` environment overrides,
and converts the result into the dataclass named by the caller, checking types,
ranges and unknown keys. Every error names the file, the key path, what was
expected and, where known, the line.

Settings classes are plain frozen dataclasses. Field metadata made by
:func:`bounded` declares numeric ranges; cross-field rules live in
``__post_init__`` and raise :class:`Invalid` with the key they concern.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from netopt.errors import ConfigError, ValidationError

if TYPE_CHECKING:
    import yaml
    from yaml.constructor import SafeConstructor

__all__ = [
    "BYTES",
    "URL_LIST",
    "Invalid",
    "KeyPath",
    "SourceMap",
    "bounded",
    "convert",
    "parse_byte_size",
    "parse_yaml",
]

T = TypeVar("T")

KeyPath = tuple[str | int, ...]

BYTES = "bytes"
"""Marker for ``Annotated[int, BYTES]``: accepts ``1048576`` or ``"1MiB"``."""
URL_LIST = "url-list"
"""Marker for ``Annotated[str, URL_LIST]``: one URL, several comma-separated, or a YAML
list of them; kept as the comma-separated string."""
MAX_URLS = 16

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}


class Invalid(ValidationError, ValueError):
    """Raised by a settings class's ``__post_init__`` to refuse a value (the loader turns
    it into a ConfigError naming the file and key; built in code, it is a
    ValidationError, and a ValueError still for callers that catch one).

    ``key`` is relative to the object being built (``"rate_mbps"``, ``"links[0]"``
    or ``""`` for the object itself).
    """

    def __init__(self, key: str, message: str, expected: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.message = message
        self.expected = expected


@dataclass(frozen=True)
class SourceMap:
    """Where each key of a parsed document came from."""

    file: str
    lines: Mapping[KeyPath, int]

    def line_of(self, path: KeyPath) -> int | None:
        """The line of ``path`` or of its nearest ancestor that has one."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]


def format_path(path: KeyPath) -> str:
    """``("links", 0, "rate_mbps")`` -> ``"links[0].rate_mbps"``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A dataclass field with a numeric range the loader enforces."""
    metadata = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def parse_byte_size(value: object) -> int:
    """``"64MiB"`` -> 67108864; ``"1.5GB"`` -> 1500000000; ints pass through.

    Raises ValueError for anything else (negative numbers included).
    """
    if isinstance(value, bool):
        raise ValueError("not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("negative size")
        return value
    if not isinstance(value, str):
        raise ValueError("not a size")
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError("not a size")
    number, unit = match.group(1), (match.group(2) or "").lower()
    if unit not in _SIZE_UNITS:
        raise ValueError("unknown unit")
    return int(float(number) * _SIZE_UNITS[unit])


# --------------------------------------------------------------------------- YAML


def parse_yaml(text: str, file: str) -> tuple[Any, SourceMap]:
    """Parse one YAML document, recording the line of every key and item.

    Duplicate keys are errors (YAML allows them silently; a config must not).
    """
    import yaml  # here, not at the top: a command that reads no file never loads it

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"is not valid YAML: {problem}", file=file, line=line, expected="a YAML mapping"
        ) from exc
    lines: dict[KeyPath, int] = {}
    if node is None:
        return {}, SourceMap(file, lines)
    constructor = yaml.constructor.SafeConstructor()
    data = _build(node, (), lines, constructor, file)
    return data, SourceMap(file, lines)


def _build(
    node: yaml.Node,
    path: KeyPath,
    lines: dict[KeyPath, int],
    constructor: SafeConstructor,
    file: str,
) -> Any:
    import yaml

    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        constructor.flatten_mapping(node)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = constructor.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                key = str(key)
            if key in result:
                raise ConfigError(
                    "appears twice",
                    file=file,
                    key_path=format_path((*path, key)),
                    line=key_node.start_mark.line + 1,
                    expected="each key once",
                )
            child = (*path, key)
            result[key] = _build(value_node, child, lines, constructor, file)
            lines[child] = key_node.start_mark.line + 1
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _build(item, (*path, index), lines, constructor, file)
            for index, item in enumerate(node.value)
        ]
    return constructor.construct_object(node, deep=True)


# --------------------------------------------------------------------- conversion


def convert(cls: type[T], data: Any, source: SourceMap) -> T:
    """Build ``cls`` (a dataclass) from parsed YAML ``data``.

    Raises ConfigError naming the file, key path, expectation and line.
    """
    return typing.cast(T, _convert(cls, data, (), source))


def _fail(source: SourceMap, path: KeyPath, message: str, expected: str | None) -> ConfigError:
    return ConfigError(
        message,
        file=source.file,
        key_path=format_path(path),
        expected=expected,
        line=source.line_of(path),
    )


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if origin is typing.Annotated and URL_LIST in get_args(tp)[1:]:
        return f"a URL, a list of 1..{MAX_URLS} URLs, or one comma-separated string of them"
    if origin is typing.Annotated:
        return "a byte size such as 1048576 or '64MiB'"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"a list of {_describe(get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}"
    if origin in (dict, Mapping):
        return "a mapping"
    if _is_optional(tp):
        inner = next(a for a in get_args(tp) if a is not type(None))
        return f"{_describe(inner)} or null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


def _is_optional(tp: Any) -> bool:
    origin = get_origin(tp)
    return origin in (typing.Union, types.UnionType) and type(None) in get_args(tp)


def _convert(tp: Any, value: Any, path: KeyPath, source: SourceMap) -> Any:
    origin = get_origin(tp)
    if _is_optional(tp):
        if value is None:
            return None
        inner = next(a for a in get_args(tp) if a is not type(None))
        return _convert(inner, value, path, source)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _convert_dataclass(tp, value, path, source)
    if origin is typing.Annotated and URL_LIST in get_args(tp)[1:]:
        return _url_list(tp, value, path, source)
    if origin is typing.Annotated:
        try:
            return parse_byte_size(value)
        except ValueError:
            raise _fail(source, path, f"is {value!r}", _describe(tp)) from None
    if origin is Literal:
        if value not in get_args(tp):
            raise _fail(source, path, f"is {value!r}", _describe(tp))
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise _fail(source, path, f"is {_kind(value)}", _describe(tp))
        item_tp = get_args(tp)[0]
        items = [_convert(item_tp, v, (*path, i), source) for i, v in enumerate(value)]
        return tuple(items)
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise _fail(source, path, f"is {_kind(value)}", _describe(tp))
        _, value_tp = get_args(tp)
        return types.MappingProxyType(
            {str(k): _convert(value_tp, v, (*path, str(k)), source) for k, v in value.items()}
        )
    return _convert_scalar(tp, value, path, source)


def _url_list(tp: Any, value: Any, path: KeyPath, source: SourceMap) -> str:
    """A URL-list key's value as one comma-separated string (what its users split)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _fail(source, path, f"is {_kind(value)}", _describe(tp))
    if not 1 <= len(value) <= MAX_URLS:
        raise _fail(source, path, f"has {len(value)} entries", _describe(tp))
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or "," in item:
            raise _fail(source, (*path, index), f"is {_kind(item)}", "one URL, such as"
                        " https://HOST:7460")  # fmt: skip
    return ",".join(item.strip() for item in value)


def _kind(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _convert_scalar(tp: Any, value: Any, path: KeyPath, source: SourceMap) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, str):
            raise _fail(source, path, "is empty", "a non-empty string")
    else:  # pragma: no cover - a programming error in a settings class
        raise TypeError(f"unsupported settings type {tp!r}")
    raise _fail(source, path, f"is {_kind(value)}", _describe(tp))


def _convert_dataclass(cls: type[Any], value: Any, path: KeyPath, source: SourceMap) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _fail(source, path, f"is {_kind(value)}", "a mapping")
    hints = get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise _fail(
            source,
            (*path, unknown[0]),
            "is not a known key",
            "one of " + ", ".join(sorted(fields)),
        )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        child = (*path, name)
        if name not in value:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise _fail(source, child, "is missing", _describe(hints[name]))
            continue
        converted = _convert(hints[name], value[name], child, source)
        _check_bounds(field, converted, child, source)
        kwargs[name] = converted
    try:
        return cls(**kwargs)
    except Invalid as exc:
        key_path = path
        if exc.key:
            key_path = (*path, *_split_key(exc.key))
        raise _fail(source, key_path, exc.message, exc.expected) from None


def _split_key(key: str) -> KeyPath:
    parts: list[str | int] = []
    for piece in key.split("."):
        match = re.fullmatch(r"([^\[]*)((?:\[\d+\])*)", piece)
        if not match:
            parts.append(piece)
            continue
        if match.group(1):
            parts.append(match.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return tuple(parts)


def _check_bounds(
    field: dataclasses.Field[Any], value: Any, path: KeyPath, source: SourceMap
) -> None:
    meta = field.metadata
    if not meta or value is None:
        return
    rules: list[tuple[str, Callable[[Any, Any], bool], str]] = [
        ("ge", operator.ge, ">="),
        ("gt", operator.gt, ">"),
        ("le", operator.le, "<="),
        ("lt", operator.lt, "<"),
    ]
    wanted = [f"{sym} {meta[key]:g}" for key, _, sym in rules if meta.get(key) is not None]
    for key, ok, _ in rules:
        bound = meta.get(key)
        if bound is not None and not ok(value, bound):
            raise _fail(source, path, f"is {value!r}", "a number " + " and ".join(wanted))
