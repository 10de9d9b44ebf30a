"""Logging: loguru everywhere, stdlib intercepted, secrets redacted on the way out.

``configure_logging`` installs exactly one loguru handler: a sink of our own (:class:`_RedactingSink`)
that builds the whole output line itself, *including* the formatted traceback, and passes the final
text through the :class:`Redactor` before anything is written. Redacting at the sink (rather than in
a loguru ``patcher``, which only sees the message) is what keeps the bot token out of exception
messages, chained causes and the URLs httpx puts into its log lines and errors.

Structured events go through :func:`event` (``phase`` plus flattened fields); :class:`EventJournal`
additionally keeps the most recent events in memory for status surfaces and tests.
"""

from __future__ import annotations

import inspect
import json as _json
import logging
import re
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any
from urllib.parse import quote

from loguru import logger

__all__ = [
    "REDACTED",
    "MIN_SECRET_LENGTH",
    "TOKEN_SHAPE",
    "Redactor",
    "InterceptHandler",
    "configure_logging",
    "add_secret",
    "redact",
    "get_redactor",
    "event",
    "RecordedEvent",
    "EventJournal",
]

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 6
#: The generic shape of a Telegram bot token (``<bot id>:<35ish url-safe chars>``); also matched
#: when the colon is percent-encoded.
TOKEN_SHAPE = re.compile(r"\d{6,12}(?::|%3[Aa])[A-Za-z0-9_-]{20,}")

#: stdlib loggers and the level they are pinned to (everything else inherits root, level 0).
STDLIB_LEVELS: dict[str, int] = {
    "httpx": logging.WARNING,
    "httpcore": logging.WARNING,
    "apscheduler": logging.WARNING,
    "aiosqlite": logging.WARNING,
    "telegram": logging.INFO,
    "telegram.ext": logging.INFO,
}

# Extra key the InterceptHandler uses to carry the stdlib logger name; consumed by the sink.
_STDLIB_NAME_KEY = "_stdlib_logger"
_CORE_JSON_KEYS = frozenset({"time", "level", "message", "logger", "exception"})


# --------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------


class Redactor:
    """Replaces registered secrets (and anything shaped like a bot token) with ``[REDACTED]``.

    Pure and thread-safe: :meth:`add` swaps in a freshly compiled pattern; :meth:`redact` reads
    whichever pattern is current. Values shorter than :data:`MIN_SECRET_LENGTH` are ignored (a
    one-character "secret" would shred every line). Each secret is also matched in its
    percent-encoded form, as it appears inside URLs.
    """

    def __init__(self, secrets: Iterable[object] = (), *, token_shape: bool = True) -> None:
        self._lock = threading.Lock()
        self._secrets: frozenset[str] = frozenset()
        self._token_shape = token_shape
        self._pattern: re.Pattern[str] | None = None
        self.add(*secrets)

    @staticmethod
    def _plain(value: object) -> str | None:
        if value is None:
            return None
        getter = getattr(value, "get_secret_value", None)  # pydantic SecretStr
        if callable(getter):
            value = getter()
        if not isinstance(value, str):
            return None
        return value

    def add(self, *values: object) -> None:
        """Register secrets (``str`` or pydantic ``SecretStr``; ``None`` and short values ignored)."""
        fresh: set[str] = set()
        for value in values:
            plain = self._plain(value)
            if plain is None:
                continue
            for variant in {plain, plain.strip(), quote(plain, safe="")}:
                if len(variant) >= MIN_SECRET_LENGTH:
                    fresh.add(variant)
        if not fresh:
            return
        with self._lock:
            secrets = self._secrets | fresh
            if secrets == self._secrets:
                return
            self._secrets = frozenset(secrets)
            self._pattern = self._compile(self._secrets)

    def _compile(self, secrets: frozenset[str]) -> re.Pattern[str] | None:
        alternatives = [re.escape(s) for s in sorted(secrets, key=len, reverse=True)]
        if self._token_shape:
            alternatives.append(TOKEN_SHAPE.pattern)
        if not alternatives:
            return None
        return re.compile("|".join(alternatives))

    @property
    def secret_count(self) -> int:
        return len(self._secrets)

    def redact(self, text: object) -> str:
        """Return ``text`` (coerced to ``str``) with every secret replaced by ``[REDACTED]``."""
        if not isinstance(text, str):
            text = str(text)
        pattern = self._pattern
        if pattern is None:
            if not self._token_shape:
                return text
            pattern = TOKEN_SHAPE
        return pattern.sub(REDACTED, text)

    def redact_value(self, value: Any) -> Any:
        """Redact inside a JSON-ish value; non-JSON objects become redacted strings."""
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(k): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.redact_value(v) for v in value]
        return self.redact(value)


_redactor = Redactor()


def get_redactor() -> Redactor:
    """The process-wide redactor the log sink uses (reuse it for user-facing error text)."""
    return _redactor


def add_secret(value: object) -> None:
    """Register a secret after :func:`configure_logging` (e.g. once settings are loaded)."""
    _redactor.add(value)


def redact(text: object) -> str:
    """Redact with the process-wide redactor."""
    return _redactor.redact(text)


# --------------------------------------------------------------------------------------------
# Sink
# --------------------------------------------------------------------------------------------


def _format_exception(exc_info: Any) -> str:
    """Format loguru's ``record["exception"]`` (type, value, traceback) ourselves."""
    if exc_info is None:
        return ""
    exc_type, exc_value, tb = exc_info
    if exc_type is None and exc_value is None:
        return ""
    if exc_value is None:
        return "".join(traceback.format_exception_only(exc_type, None)).rstrip("\n")
    return "".join(traceback.format_exception(exc_type, exc_value, tb)).rstrip("\n")


def _human_value(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    if text == "" or any(c.isspace() or c in '="' for c in text):
        return _json.dumps(text, ensure_ascii=False)
    return text


class _RedactingSink:
    """Loguru sink callable: builds the final text (line + traceback), redacts it, writes it."""

    def __init__(self, target: Any, *, json: bool, redactor: Redactor) -> None:
        self._target = target  # None -> sys.stderr looked up at each write
        self._json = json
        self._redactor = redactor

    def __call__(self, message: Any) -> None:
        try:
            text = self.render(message.record)
            self._write(text + "\n")
        except Exception as exc:  # never raise into the logging call, never echo the record
            try:
                sys.__stderr__.write(f"topicbus logging failure: {type(exc).__name__}\n")
            except Exception:
                pass

    def _write(self, text: str) -> None:
        target = self._target if self._target is not None else sys.stderr
        write = getattr(target, "write", None)
        if write is not None:
            write(text)
            flush = getattr(target, "flush", None)
            if flush is not None:
                flush()
        else:
            target(text)

    def render(self, record: dict[str, Any]) -> str:
        r = self._redactor
        extra = dict(record["extra"])
        name = extra.pop(_STDLIB_NAME_KEY, None) or record["name"] or ""
        # phase first, then the other fields in bind order
        if "phase" in extra:
            extra = {"phase": extra.pop("phase"), **extra}
        exc_text = _format_exception(record["exception"])
        when = record["time"].astimezone(UTC)
        level = record["level"].name
        message = record["message"]

        if self._json:
            obj: dict[str, Any] = {
                "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "level": level,
                "message": r.redact(message),
                "logger": r.redact(name),
            }
            for key, value in extra.items():
                key = r.redact(key)
                if key in _CORE_JSON_KEYS:
                    key = f"extra.{key}"
                obj[key] = r.redact_value(value)
            if exc_text:
                obj["exception"] = r.redact(exc_text)
            text = _json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
        else:
            stamp = when.strftime("%Y-%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d}"
            parts = [stamp, level, message]
            if extra:
                parts.append(" ".join(f"{k}={_human_value(r.redact(v))}" for k, v in extra.items()))
            text = " | ".join(parts)
            if exc_text:
                text = f"{text}\n{exc_text}"
        # Final pass over the whole string: nothing leaves unredacted (keys, names, anything).
        return r.redact(text)


# --------------------------------------------------------------------------------------------
# stdlib interception
# --------------------------------------------------------------------------------------------


class InterceptHandler(logging.Handler):
    """The loguru README recipe: route stdlib records into loguru, keeping the caller depth."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            try:
                level: str | int = logger.level(record.levelname).name
            except ValueError:
                level = record.levelno
            frame, depth = inspect.currentframe(), 0
            while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
                frame = frame.f_back
                depth += 1
            logger.bind(**{_STDLIB_NAME_KEY: record.name}).opt(
                depth=depth, exception=record.exc_info
            ).log(level, record.getMessage())
        except Exception:
            self.handleError(record)


_config_lock = threading.Lock()
_handler_id: int | None = None


def configure_logging(
    *,
    level: str = "INFO",
    json: bool = False,
    secrets: Iterable[object] = (),
    sink: Any = None,
) -> None:
    """Configure loguru (idempotent: a second call replaces the first configuration).

    ``sink`` is a text stream (anything with ``write``) or a callable taking the final string;
    ``None`` means ``sys.stderr``, looked up at each write. ``secrets`` are *added* to the
    process-wide redactor: a secret once registered stays redacted for the life of the process.
    """
    global _handler_id
    level_name = level.strip().upper()
    logger.level(level_name)  # ValueError on an unknown level, before anything is torn down
    with _config_lock:
        _redactor.add(*secrets)
        logger.remove()
        _handler_id = logger.add(
            _RedactingSink(sink, json=json, redactor=_redactor),
            level=level_name,
            format="{message}",
            colorize=False,
            backtrace=False,
            diagnose=False,  # never render local variables (they hold tokens)
            catch=False,  # loguru's own error report would print the unredacted record
            enqueue=False,
        )
        logging.basicConfig(handlers=[InterceptHandler()], level=0, force=True)
        for name, stdlib_level in STDLIB_LEVELS.items():
            logging.getLogger(name).setLevel(stdlib_level)


# --------------------------------------------------------------------------------------------
# Structured events
# --------------------------------------------------------------------------------------------


def _describe(message: str | BaseException) -> str:
    if isinstance(message, BaseException):
        detail = str(message)
        return f"{type(message).__name__}: {detail}" if detail else type(message).__name__
    return message if isinstance(message, str) else str(message)


def _emit(message: str | BaseException, *, phase: str, level: str, depth: int, fields: dict[str, Any]) -> None:
    level_name = level.strip().upper()
    text = _describe(message)
    exception: BaseException | None = None
    if isinstance(message, BaseException) and logger.level(level_name).no >= logger.level("ERROR").no:
        exception = message
    logger.bind(phase=phase, **fields).opt(depth=depth + 1, exception=exception).log(level_name, text)


def event(message: str | BaseException, /, *, phase: str, level: str = "INFO", **fields: Any) -> None:
    """Log a structured event: ``phase`` and ``fields`` land in the record's extras.

    An exception logs as ``Type: message``; its traceback is attached only at ERROR and above.
    """
    _emit(message, phase=phase, level=level, depth=1, fields=fields)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    at_ms: int
    level: str
    phase: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class EventJournal:
    """Bounded in-memory ring of recent events (oldest dropped first); also logs each one."""

    def __init__(self, maxlen: int = 500, *, clock: Callable[[], int] = _wall_ms) -> None:
        if maxlen <= 0:
            raise ValueError("maxlen must be positive")
        self._events: deque[RecordedEvent] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._clock = clock

    @property
    def maxlen(self) -> int:
        return self._events.maxlen or 0

    def __len__(self) -> int:
        return len(self._events)

    def record(
        self, message_or_error: str | BaseException, /, *, phase: str, level: str = "INFO", **fields: Any
    ) -> RecordedEvent | None:
        """Store and log one event. Never raises: a logging failure must not change control flow.

        The stored message and string fields are redacted. Returns the stored event (``None`` only
        if even building it failed).
        """
        stored: RecordedEvent | None = None
        try:
            stored = RecordedEvent(
                at_ms=int(self._clock()),
                level=str(level).strip().upper(),
                phase=str(phase),
                message=_redactor.redact(_describe(message_or_error)),
                fields={k: (_redactor.redact(v) if isinstance(v, str) else v) for k, v in fields.items()},
            )
            with self._lock:
                self._events.append(stored)
        except Exception:
            pass
        try:
            _emit(message_or_error, phase=phase, level=level, depth=1, fields=fields)
        except Exception:
            pass
        return stored

    def recent(self, phase: str | None = None) -> list[RecordedEvent]:
        """Oldest first; only events of ``phase`` when given."""
        with self._lock:
            events = list(self._events)
        if phase is None:
            return events
        return [e for e in events if e.phase == phase]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
