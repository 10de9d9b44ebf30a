"""topicbus.logsetup: redaction everywhere (message, extras, tracebacks, intercepted stdlib), the
human format, loguru's JSON serialization, levels, structured events and the in-memory journal."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from datetime import datetime

import httpx
import pytest
from loguru import logger
from pydantic import SecretStr

from topicbus import logsetup
from topicbus.logsetup import (
    REDACTED,
    EventJournal,
    RecordedEvent,
    Redactor,
    add_secret,
    configure_logging,
    event,
)

TOKEN = "123456:ABC-secret"  # too short for the generic shape, so registered
SHAPED = "987654321:AAHf3kZ9x_abcdefghijklmnopqrs"  # matches the generic bot-token shape


@pytest.fixture(autouse=True)
def _restore_logging():
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_levels = {name: logging.getLogger(name).level for name in logsetup.STDLIB_LEVELS}
    yield
    logger.configure(patcher=lambda record: None, handlers=[{"sink": sys.stderr, "level": "DEBUG"}])
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)
    for name, level in saved_levels.items():
        logging.getLogger(name).setLevel(level)


def _setup(**kwargs) -> io.StringIO:
    out = io.StringIO()
    kwargs.setdefault("secrets", [TOKEN])
    configure_logging(sink=out, **kwargs)
    return out


def _json_lines(out: io.StringIO) -> list[dict]:
    """loguru's serialized lines: ``{"text": <the human line>, "record": {...}}``."""
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def _fail_with_token(token: str) -> None:
    local_token = token  # a local holding the secret: must never be rendered (diagnose=False)
    raise RuntimeError(f"request to /bot{local_token}/sendMessage failed")


# --- redaction -------------------------------------------------------------------------------


def test_secret_redacted_in_message():
    out = _setup()
    logger.info(f"calling https://api.telegram.org/bot{TOKEN}/getMe")
    text = out.getvalue()
    assert TOKEN not in text
    assert f"/bot{REDACTED}/getMe" in text


@pytest.mark.parametrize("as_json", [False, True])
def test_secret_redacted_in_extra_fields(as_json):
    out = _setup(json=as_json)
    event("provisioned", phase="registration", url=f"http://x/bot{TOKEN}/x", nested={"k": [TOKEN]})
    logger.bind(token=TOKEN).info("bound")
    text = out.getvalue()
    assert TOKEN not in text
    assert REDACTED in text
    if as_json:
        first, second = (line["record"]["extra"] for line in _json_lines(out))
        assert first["url"] == f"http://x/bot{REDACTED}/x"
        assert first["nested"] == {"k": [REDACTED]}
        assert second["token"] == REDACTED


def test_secret_with_quote_characters_redacted_in_human_extras():
    secret = 'pa ss"word=1'
    out = _setup(secrets=[secret])
    event("x", phase="p", value=f"<{secret}>")
    assert "pa ss" not in out.getvalue()
    assert REDACTED in out.getvalue()


@pytest.mark.parametrize("as_json", [False, True])
def test_secret_redacted_in_traceback(as_json):
    out = _setup(json=as_json)
    try:
        try:
            _fail_with_token(TOKEN)
        except RuntimeError as inner:
            raise ValueError(f"wrapped: {TOKEN}") from inner
    except ValueError as outer:
        logger.exception("operation failed")
        original = outer
    text = out.getvalue()
    assert TOKEN not in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: request to /bot[REDACTED]/sendMessage failed" in text
    assert "The above exception was the direct cause of the following exception" in text
    assert "ValueError: wrapped: [REDACTED]" in text
    assert "_fail_with_token" in text
    assert str(original) == f"wrapped: {TOKEN}"  # the caller's exception is left untouched
    if as_json:
        (line,) = _json_lines(out)
        assert line["record"]["message"] == "operation failed"
        assert line["record"]["exception"] == {"type": "ValueError", "value": f"wrapped: {REDACTED}",
                                               "traceback": True}
        assert "RuntimeError: request to /bot[REDACTED]/sendMessage failed" in line["text"]


def test_secret_redacted_in_exception_groups_notes_and_context():
    out = _setup()
    group = ExceptionGroup(f"group {TOKEN}", [KeyError(TOKEN), OSError(5, f"io {TOKEN}")])
    group.add_note(f"note {TOKEN}")
    try:
        try:
            raise group
        except ExceptionGroup:
            raise LookupError(f"while handling {TOKEN}")  # implicit __context__
    except LookupError:
        logger.exception("grouped")
    text = out.getvalue()
    assert TOKEN not in text
    for line in ("ExceptionGroup: group [REDACTED]", "KeyError: '[REDACTED]'", "OSError: [Errno 5] io [REDACTED]",
                 "note [REDACTED]", "During handling of the above exception", "LookupError: while handling [REDACTED]"):
        assert line in text, line


def test_generic_token_shape_redacted_without_registration():
    out = _setup(secrets=[])
    logger.warning(f"leaked {SHAPED} and percent-encoded {SHAPED.replace(':', '%3A')}")
    text = out.getvalue()
    assert "AAHf3kZ9x" not in text
    assert text.count(REDACTED) == 2


def test_intercepted_httpx_warning_with_token_in_url():
    out = _setup()
    logging.getLogger("httpx").warning(
        'HTTP Request: POST http://127.0.0.1:1/bot123456:ABC-secret/getMe "HTTP/1.1 502 Bad Gateway"'
    )
    text = out.getvalue()
    assert "ABC-secret" not in text
    assert f"http://127.0.0.1:1/bot{REDACTED}/getMe" in text


def test_intercepted_httpx_info_is_dropped_and_json_logger_name():
    out = _setup(json=True, level="DEBUG")
    logging.getLogger("httpx").info("HTTP Request: POST http://127.0.0.1:1/botX/getMe")
    logging.getLogger("httpx").warning("slow")
    (line,) = _json_lines(out)
    record = line["record"]
    assert record["name"] == "httpx"
    assert record["level"]["name"] == "WARNING"
    assert record["message"] == "slow"
    assert record["extra"] == {}  # the carrier of the stdlib name is not left in the fields
    assert record["function"] == "test_intercepted_httpx_info_is_dropped_and_json_logger_name"  # the caller


def test_httpx_error_url_redacted_in_stdlib_exc_info():
    """A real httpx.HTTPStatusError (its message carries the URL) logged via stdlib exc_info."""
    out = _setup()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"ok": False})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        response = client.post(f"http://127.0.0.1:1/bot{TOKEN}/getMe")
        with pytest.raises(httpx.HTTPStatusError) as info:
            response.raise_for_status()
    assert TOKEN in str(info.value)  # precondition: the library puts the token in the message
    try:
        raise info.value
    except httpx.HTTPStatusError:
        logging.getLogger("telegram.ext").error("request failed", exc_info=True)
    text = out.getvalue()
    assert "httpx.HTTPStatusError: Client error '404 Not Found'" in text  # qualified type name kept
    assert TOKEN not in text
    assert f"/bot{REDACTED}/getMe" in text


def test_add_secret_after_configuration_and_short_values_ignored():
    out = _setup(secrets=[])
    later = "late-secret-value-42"
    logger.info(f"before {later}")
    add_secret(SecretStr(later))
    add_secret("abc")  # shorter than 6: ignored
    add_secret(None)
    logger.info(f"after {later} abc")
    first, second = out.getvalue().splitlines()
    assert later in first
    assert later not in second
    assert second.endswith(f"after {REDACTED} abc")


def test_redactor_is_pure_and_handles_variants():
    r = Redactor(["secret-one", "secret-one-longer", "a b/c:d?e"], token_shape=False)
    assert r.redact("x secret-one-longer y secret-one") == f"x {REDACTED} y {REDACTED}"
    assert r.redact("url/a%20b%2Fc%3Ad%3Fe/") == f"url/{REDACTED}/"
    assert r.redact(SHAPED) == SHAPED  # shape matching disabled for this instance
    assert r.redact(12345) == "12345"
    assert r.redact_value({"k": ["secret-one", 3, None]}) == {"k": [REDACTED, 3, None]}
    assert Redactor().redact(f"t={SHAPED}") == f"t={REDACTED}"
    assert Redactor(["short"], token_shape=False).redact("short") == "short"  # too short to register
    assert Redactor(token_shape=False).redact(SHAPED) == SHAPED


# --- formats and levels ----------------------------------------------------------------------


def test_human_format():
    out = _setup()
    event("hello", phase="boot", instanceId="abc", note="two words", markup="<b>{x}</b>", ok=True)
    logger.bind(before=1).info("phase comes first", phase="late")
    logger.info("plain {braces} <b>kept</b>")
    first, second, third = out.getvalue().splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"
    assert re.fullmatch(
        stamp + r' \| INFO \| hello \| phase=boot instanceId=abc note="two words" markup=<b>{x}</b> ok=True', first
    ), first
    assert re.fullmatch(stamp + r" \| INFO \| phase comes first \| phase=late before=1", second), second
    assert re.fullmatch(stamp + r" \| INFO \| plain {braces} <b>kept</b>", third), third


def test_json_lines_are_loguru_serialization_with_phase_and_fields():
    out = _setup(json=True)
    event("registered", phase="registration", instanceId="i-1", generation=3, ok=True, message="clash")
    logger.info("no extras {braces} kept")
    first, second = _json_lines(out)
    record = first["record"]
    assert record["message"] == "registered"
    assert record["level"]["name"] == "INFO"
    assert record["extra"] == {"phase": "registration", "instanceId": "i-1", "generation": 3, "ok": True,
                               "message": "clash"}  # an extra never overwrites a core key
    assert record["name"] == __name__  # the caller of event(), not topicbus.logsetup
    assert record["exception"] is None
    when = datetime.fromisoformat(record["time"]["repr"])
    assert when.utcoffset().total_seconds() == 0  # UTC
    assert when.timestamp() == pytest.approx(record["time"]["timestamp"])
    assert first["text"].rstrip("\n").endswith(" | INFO | registered | phase=registration instanceId=i-1 "
                                               "generation=3 ok=True message=clash")
    assert second["record"]["message"] == "no extras {braces} kept"
    assert len(out.getvalue().splitlines()) == 2  # compact: one object per line


def test_level_filtering():
    out = _setup(level="warning")
    logger.info("dropped")
    logging.getLogger("some.lib").info("dropped too")
    logger.warning("kept")
    logging.getLogger("some.lib").error("kept too")
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[2] for line in lines] == ["kept", "kept too"]


def test_stdlib_logger_levels_pinned():
    out = _setup(level="DEBUG")
    logging.getLogger("telegram.ext").debug("ptb debug")
    logging.getLogger("telegram.ext").info("ptb info")
    logging.getLogger("apscheduler.scheduler").info("job added")
    logging.getLogger("aiosqlite").debug("sql")
    logging.getLogger("httpcore.connection").debug("connect")
    logging.getLogger("app.other").debug("app debug")
    text = out.getvalue()
    assert "ptb info" in text and "app debug" in text
    for dropped in ("ptb debug", "job added", "sql", "connect"):
        assert dropped not in text


def test_stdlib_message_that_cannot_be_formatted_does_not_raise(capsys):
    _setup()
    logging.getLogger("some.lib").warning("%d items", "not a number")  # stdlib reports it on stderr
    assert "--- Logging error ---" in capsys.readouterr().err


def test_configure_is_idempotent_and_reconfigures():
    first = _setup()
    second = _setup(json=True)
    logger.info("once")
    assert first.getvalue() == ""
    assert len(_json_lines(second)) == 1
    assert sum(isinstance(h, logsetup.InterceptHandler) for h in logging.getLogger().handlers) == 1


def test_unknown_level_rejected_before_teardown():
    out = _setup()
    with pytest.raises(ValueError):
        configure_logging(level="LOUD", sink=io.StringIO())
    logger.info("still here")
    assert "still here" in out.getvalue()


def test_callable_sink():
    lines: list[str] = []
    configure_logging(sink=lines.append, secrets=[TOKEN])
    logger.info(TOKEN)
    assert lines and lines[0].endswith(f"| {REDACTED}\n")


def test_default_sink_is_the_current_stderr(capsys):
    configure_logging(secrets=[TOKEN])
    logger.info(f"to stderr {TOKEN}")
    err = capsys.readouterr().err
    assert f"| INFO | to stderr {REDACTED}" in err and TOKEN not in err


# --- events ----------------------------------------------------------------------------------


def test_event_with_exception_below_error_has_no_traceback():
    out = _setup(json=True)
    event(ValueError(f"bad value {TOKEN}"), phase="prune", level="WARNING", instanceId="i-2")
    event(KeyError(), phase="prune", level="warning")
    first, second = (line["record"] for line in _json_lines(out))
    assert first["message"] == f"ValueError: bad value {REDACTED}"
    assert first["level"]["name"] == "WARNING"
    assert first["exception"] is None
    assert second["message"] == "KeyError"


def test_event_with_exception_at_error_has_traceback():
    out = _setup(json=True)
    try:
        _fail_with_token(TOKEN)
    except RuntimeError as exc:
        event(exc, phase="cleanup", level="ERROR")
    (line,) = _json_lines(out)
    assert line["record"]["message"].startswith("RuntimeError: ")
    assert line["record"]["exception"]["type"] == "RuntimeError"
    assert "Traceback" in line["text"] and "_fail_with_token" in line["text"]
    assert TOKEN not in json.dumps(line)


def test_unprintable_field_is_logged_not_raised():
    out = _setup()

    class Unprintable:
        def __str__(self):
            raise RuntimeError("no str")

    event("odd field", phase="p", thing=Unprintable())
    assert "odd field | phase=p thing=\"<unprintable Unprintable>\"" in out.getvalue()


# --- journal ---------------------------------------------------------------------------------


def test_journal_is_bounded_and_filters_by_phase():
    _setup()
    ticks = iter(range(1000, 2000))
    journal = EventJournal(maxlen=3, clock=lambda: next(ticks))
    for i in range(5):
        journal.record(f"e{i}", phase="prune" if i % 2 else "registration", i=i)
    assert [e.message for e in journal.recent()] == ["e2", "e3", "e4"]
    assert [e.message for e in journal.recent("prune")] == ["e3"]
    assert journal.recent("nothing") == []
    assert journal.recent()[0] == RecordedEvent(at_ms=1002, level="INFO", phase="registration", message="e2", fields={"i": 2})
    default = EventJournal()
    for i in range(501):
        default.record(f"d{i}", phase="p")
    assert len(default.recent()) == 500 and default.recent()[0].message == "d1"
    with pytest.raises(ValueError):
        EventJournal(maxlen=0)


def test_journal_records_errors_redacted_and_logs_them():
    out = _setup(json=True)
    journal = EventJournal()
    stored = journal.record(RuntimeError(f"boom {TOKEN}"), phase="cleanup", level="warning", url=f"/bot{TOKEN}")
    assert stored is not None
    assert stored.message == f"RuntimeError: boom {REDACTED}"
    assert stored.fields == {"url": f"/bot{REDACTED}"}
    assert stored.level == "WARNING"
    (line,) = _json_lines(out)
    assert line["record"]["extra"]["phase"] == "cleanup" and line["record"]["message"] == stored.message
    assert line["record"]["name"] == __name__


def test_record_swallows_sink_errors():
    _setup()

    def exploding_sink(message):
        raise OSError("disk full")

    logger.add(exploding_sink, catch=False)
    journal = EventJournal()
    with pytest.raises(OSError):
        event("direct", phase="p")  # event itself does not hide failures
    stored = journal.record("through the journal", phase="p")
    assert stored is not None and journal.recent() == [stored]
    assert journal.record("bad level", phase="p", level="NOPE") is not None

    class Unprintable:
        def __str__(self):
            raise RuntimeError("no str")

    assert journal.record("odd field", phase="p", thing=Unprintable()) is not None
    assert len(journal.recent()) == 3


def test_broken_stream_never_raises_and_loguru_error_report_is_redacted(capsys):
    out = _setup()
    out.close()
    logger.info(f"into a closed stream {TOKEN}")  # no exception into the caller
    assert EventJournal().record(f"still fine {TOKEN}", phase="p") is not None
    err = capsys.readouterr().err
    assert err.count("Logging error in Loguru Handler") == 2  # loguru reported both failures...
    assert f"into a closed stream {REDACTED}" in err and f"still fine {REDACTED}" in err
    assert TOKEN not in err  # ...with the scrubbed record


def test_a_repeated_warning_is_logged_the_first_time_then_once_an_interval_with_a_count():
    now = [1000.0]
    warning = logsetup.RepeatedWarning(60.0, clock=lambda: now[0])
    said = []
    for _ in range(20):  # a retry every 3 s for 57 s: only the first is logged
        said.append(warning.occurred())
        now[0] += 3.0
    assert said == [1] + [None] * 19
    assert warning.occurred() == 20  # 60 s after the first line: this one and the 19 kept quiet
    now[0] += 59.9
    assert warning.occurred() is None
    now[0] += 0.1
    assert warning.occurred() == 2
    now[0] += 1.0
    assert warning.occurred() is None
    assert warning.reset() == 1  # the condition ended: one occurrence was never reported
    assert warning.occurred() == 1  # a new outage is told at once
    assert warning.reset() == 0
