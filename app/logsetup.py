"""Logging: loguru everywhere, stdlib intercepted, secrets redacted before anything is formatted.

Loguru formats each line (:func:`_format`) and, with ``LOG_JSON``, serializes it (``serialize=True``).
Before any handler sees a record, one patcher (:func:`_scrub`) redacts its message, extra fields and
exception. As in Home Assistant's ``telegram_bot`` log filter, the handler must not be able to
re-expand the original exception, so the patcher hands loguru stand-ins with the same type names,
frames and chain but redacted text. Local variables are never rendered (``diagnose=False``).
Structured events (:func:`event`, :class:`EventJournal`) carry a ``phase`` plus fields in ``extra``.
"""

from __future__ import annotations

import contextlib
import inspect
import json as _json
import logging
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from loguru import logger

if TYPE_CHECKING:
    from loguru import Record  # loguru's stubs only

__all__ = ["REDACTED", "Redactor", "InterceptHandler", "configure_logging", "add_secret", "redact", "event",
           "RecordedEvent", "EventJournal", "RepeatedWarning"]

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 6  # shorter "secrets" would shred every line
#: A Telegram bot token (``<bot id>:<35ish url-safe chars>``), also with the colon percent-encoded.
TOKEN_SHAPE = re.compile(r"\d{6,12}(?::|%3[Aa])[A-Za-z0-9_-]{20,}")
#: stdlib loggers and the level they are pinned to (everything else inherits root, level 0).
STDLIB_LEVELS = {"httpx": logging.WARNING, "httpcore": logging.WARNING, "apscheduler": logging.WARNING,
                 "aiosqlite": logging.WARNING, "telegram": logging.INFO, "telegram.ext": logging.INFO}
_STDLIB_NAME = "_stdlib_logger"  # extra key carrying a stdlib logger's name into record["name"]


class Redactor:
    """Replaces registered secrets (also percent-encoded, as in URLs) and anything shaped like a bot
    token with ``[REDACTED]``. :meth:`add` swaps in a freshly compiled pattern (thread-safe)."""

    def __init__(self, secrets: Iterable[object] = (), *, token_shape: bool = True) -> None:
        self._lock = threading.Lock()
        self._secrets: frozenset[str] = frozenset()
        self._shape = [TOKEN_SHAPE.pattern] if token_shape else []
        self._pattern = TOKEN_SHAPE if token_shape else None
        self.add(*secrets)

    def add(self, *values: object) -> None:
        """Register secrets (``str`` or pydantic ``SecretStr``; ``None`` and short values ignored)."""
        fresh = set()
        for value in values:
            getter = getattr(value, "get_secret_value", None)
            plain = getter() if callable(getter) else value
            if isinstance(plain, str):
                fresh |= {v for v in (plain, plain.strip(), quote(plain, safe="")) if len(v) >= MIN_SECRET_LENGTH}
        with self._lock:
            if not fresh <= self._secrets:
                self._secrets |= fresh
                longest_first = [re.escape(s) for s in sorted(self._secrets, key=len, reverse=True)]
                self._pattern = re.compile("|".join(longest_first + self._shape))

    def redact(self, text: object) -> str:
        text = text if isinstance(text, str) else str(text)
        return self._pattern.sub(REDACTED, text) if self._pattern is not None else text

    def redact_value(self, value: Any) -> Any:
        """Redact inside a JSON-ish value; other objects become redacted strings."""
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, dict):
            return {self.redact(k): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.redact_value(v) for v in value]
        return self.redact(value)


_redactor = Redactor()


def add_secret(value: object) -> None:
    """Register a secret (at any time); it stays redacted for the life of the process."""
    _redactor.add(value)


def redact(text: object) -> str:
    """Redact with the process-wide redactor (the one the patcher uses)."""
    return _redactor.redact(text)


def _safely(convert: Callable[[Any], Any], value: Any) -> Any:
    try:
        return convert(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


_stand_in_types: dict[type, type] = {}


def _stand_in(exc: BaseException, seen: dict[int, BaseException]) -> BaseException:
    """A copy of ``exc`` for loguru to render: same type name, frames and chain; redacted text."""
    if id(exc) in seen:
        return seen[id(exc)]
    cls, group = type(exc), isinstance(exc, BaseExceptionGroup)
    if cls not in _stand_in_types:
        _stand_in_types[cls] = type(cls.__name__, (ExceptionGroup if group else Exception,), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__str__": lambda self: self.text})
    text = redact(_safely(str, exc))
    copy = _stand_in_types[cls](text, *([[_stand_in(e, seen) for e in exc.exceptions]]
                                         if isinstance(exc, BaseExceptionGroup) else []))
    seen[id(exc)] = copy
    copy.text, copy.__traceback__ = text, exc.__traceback__
    copy.__cause__ = exc.__cause__ and _stand_in(exc.__cause__, seen)
    copy.__context__ = exc.__context__ and _stand_in(exc.__context__, seen)
    copy.__suppress_context__ = exc.__suppress_context__  # after __cause__, whose setter sets it
    if isinstance(notes := getattr(exc, "__notes__", None), list):
        copy.__notes__ = [redact(_safely(str, note)) for note in notes]
    return copy


def _scrub(record: Record) -> None:
    """The patcher: message, extra fields (keys too) and exception redacted; time in UTC."""
    try:
        extra = record["extra"]
        record["name"] = extra.pop(_STDLIB_NAME, None) or record["name"]
        record["time"] = record["time"].astimezone(UTC)
        record["message"] = redact(record["message"])
        record["extra"] = {redact(k): _safely(_redactor.redact_value, v) for k, v in extra.items()}
        if (exc := record["exception"]) is not None and isinstance(exc.value, BaseException):
            record["exception"] = exc._replace(value=_stand_in(exc.value, {}))
    except Exception:  # a record that cannot be cleaned is not written as it was
        record.update({"message": "[log record withheld: redaction failed]", "extra": {}, "exception": None})


def _human(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return _json.dumps(text, ensure_ascii=False) if text == "" or any(c.isspace() or c in '="' for c in text) else text


def _format(record: Record) -> str:
    """``time (UTC) | LEVEL | message | phase=… key=value …``, then the traceback if any. The fields go
    into ``record["fields"]``, not into the template, where loguru would parse ``{}`` and ``<tags>``."""
    fields = sorted(record["extra"].items(), key=lambda kv: kv[0] != "phase")  # phase first
    record["fields"] = (  # type: ignore[typeddict-unknown-key]  # a key of ours, read by the template below
        " | " + " ".join(f"{k}={_human(v)}" for k, v in fields) if fields else "")
    return "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level} | {message}{fields}\n{exception}"


class InterceptHandler(logging.Handler):
    """The loguru README recipe: stdlib records into loguru, keeping the caller and logger name."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            try:
                level: str | int = logger.level(record.levelname).name
            except ValueError:
                level = record.levelno
            frame, depth = inspect.currentframe(), 0
            while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
                frame, depth = frame.f_back, depth + 1
            logger.bind(**{_STDLIB_NAME: record.name}).opt(depth=depth, exception=record.exc_info).log(
                level, record.getMessage())
        except Exception:
            self.handleError(record)


def _to_stderr(message: str) -> None:
    sys.stderr.write(message)  # looked up at each write: tests and the CLI swap it


def configure_logging(*, level: str = "INFO", json: bool = False, secrets: Iterable[object] = (),
                      sink: Any = None) -> None:
    """(Re)configure loguru: one handler on ``sink`` (a stream or callable; default stderr), loguru's
    serialization when ``json``. A failing sink never raises into the caller: loguru reports it on
    stderr, with the already scrubbed record."""
    level_name = level.strip().upper()
    logger.level(level_name)  # ValueError on an unknown level, before anything is torn down
    _redactor.add(*secrets)
    logger.configure(patcher=_scrub, handlers=[{
        "sink": _to_stderr if sink is None else sink, "level": level_name, "format": _format,
        "serialize": json, "colorize": False, "backtrace": False, "diagnose": False, "catch": True}])
    logging.basicConfig(handlers=[InterceptHandler()], level=0, force=True)
    for name, stdlib_level in STDLIB_LEVELS.items():
        logging.getLogger(name).setLevel(stdlib_level)


def _describe(message: str | BaseException) -> str:
    if isinstance(message, BaseException):
        return f"{type(message).__name__}: {message}" if str(message) else type(message).__name__
    return message if isinstance(message, str) else str(message)


def _emit(message: str | BaseException, *, phase: str, level: str, fields: dict[str, Any]) -> None:
    level_name = level.strip().upper()
    error = message if isinstance(message, BaseException) else None
    attach = error is not None and logger.level(level_name).no >= logger.level("ERROR").no
    logger.bind(phase=phase, **fields).opt(depth=2, exception=error if attach else None).log(
        level_name, _describe(message))


def event(message: str | BaseException, /, *, phase: str, level: str = "INFO", **fields: Any) -> None:
    """Log a structured event: ``phase`` and ``fields`` land in the record's extras. An exception
    logs as ``Type: message``; its traceback is attached only at ERROR and above."""
    _emit(message, phase=phase, level=level, fields=fields)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    at_ms: int
    level: str
    phase: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


class EventJournal:
    """Bounded in-memory ring of recent events (oldest dropped first); also logs each one."""

    def __init__(self, maxlen: int = 500, *, clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000):
        if maxlen <= 0:
            raise ValueError("maxlen must be positive")
        self._events: deque[RecordedEvent] = deque(maxlen=maxlen)  # append and list() are atomic
        self._clock = clock

    def record(self, message_or_error: str | BaseException, /, *, phase: str, level: str = "INFO",
               **fields: Any) -> RecordedEvent | None:
        """Store (redacted) and log one event. Never raises: logging must not change control flow."""
        stored = None
        with contextlib.suppress(Exception):
            stored = RecordedEvent(at_ms=int(self._clock()), level=str(level).strip().upper(), phase=str(phase),
                                   message=redact(_describe(message_or_error)),
                                   fields={k: redact(v) if isinstance(v, str) else v for k, v in fields.items()})
            self._events.append(stored)
        with contextlib.suppress(Exception):
            _emit(message_or_error, phase=phase, level=level, fields=fields)
        return stored

    def recent(self, phase: str | None = None) -> list[RecordedEvent]:
        """Oldest first; only events of ``phase`` when given."""
        events = list(self._events)
        return events if phase is None else [e for e in events if e.phase == phase]


class RepeatedWarning:
    """Whether a warning that keeps recurring (``follow`` failing to reach the leader on every retry)
    is logged now: the first time, then at most once per ``interval_s``, with how many times it
    happened since it was last logged. :meth:`reset` when the condition ends (the next occurrence
    is logged at once again). Pure: ``clock`` (seconds, monotonic) is injectable."""

    def __init__(self, interval_s: float = 60.0, *, clock: Callable[[], float] = time.monotonic):
        if interval_s < 0:
            raise ValueError("interval_s must not be negative")
        self.interval_s = interval_s
        self._clock = clock
        self._logged_at: float | None = None
        self._count = 0  # occurrences since the last logged one

    def occurred(self) -> int | None:
        """One more occurrence: None to stay quiet, else how many occurrences the line reports
        (1 the first time; after a quiet interval, this one and those kept quiet)."""
        now = self._clock()
        self._count += 1
        if self._logged_at is not None and now - self._logged_at < self.interval_s:
            return None
        count, self._count, self._logged_at = self._count, 0, now
        return count

    def reset(self) -> int:
        """The condition ended: returns how many occurrences were kept quiet since the last line."""
        quiet, self._count, self._logged_at = self._count, 0, None
        return quiet
