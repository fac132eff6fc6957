"""Log record formats: ``text`` for people, ``json`` for log pipelines (one object a line).

JSON lines carry ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``,
``message``, ``pid`` and, when there is one, ``exc`` (the formatted traceback); what a
call passes as ``extra={...}`` is added too (JSON-able values only, others as text).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any, Literal

__all__ = ["LOG_FORMATS", "JsonFormatter", "LogFormat", "formatter"]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        out: dict[str, Any] = {
            "ts": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value if _jsonable(value) else repr(value)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def formatter(kind: LogFormat) -> logging.Formatter:
    """The formatter for ``kind``."""
    return JsonFormatter() if kind == "json" else logging.Formatter(TEXT_FORMAT)
