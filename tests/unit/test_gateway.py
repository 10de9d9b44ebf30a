"""topicbus.bot.gateway: every Telegram failure classified in one place, and RetryAfter in seconds.
(PTB strips a "Bad Request: " prefix and capitalises what is left; other messages stay as sent.)"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from telegram.error import BadRequest, Conflict, Forbidden, NetworkError, RetryAfter, TimedOut
from telegram.warnings import PTBDeprecationWarning

from topicbus import cli
from topicbus.core.telegram import CallOutcome, CallResult
from topicbus.bot.gateway import classify, retry_after_seconds


@pytest.mark.parametrize("error, expected", [
    (BadRequest("Bad Request: TOPIC_NOT_MODIFIED"), CallResult(CallOutcome.NOT_MODIFIED, "Topic_not_modified")),
    (BadRequest("Bad Request: message is not modified: specified new message content is the same"),
     CallResult(CallOutcome.NOT_MODIFIED, "Message is not modified: specified new message content is the same")),
    (BadRequest("Bad Request: message thread not found"), CallResult(CallOutcome.GONE, "Message thread not found")),
    (BadRequest("Bad Request: TOPIC_ID_INVALID"), CallResult(CallOutcome.GONE, "Topic_id_invalid")),
    (BadRequest("Bad Request: TOPIC_DELETED"), CallResult(CallOutcome.GONE, "Topic_deleted")),
    (BadRequest("Bad Request: not enough rights to create a topic"),
     CallResult(CallOutcome.REJECTED, "Not enough rights to create a topic")),
    (Forbidden("Forbidden: bot was kicked from the supergroup chat"),
     CallResult(CallOutcome.REJECTED, "Forbidden: bot was kicked from the supergroup chat")),
    (TimedOut(), CallResult(CallOutcome.AMBIGUOUS, "Timed out")),
    (NetworkError("httpx.ConnectError: All connection attempts failed"),
     CallResult(CallOutcome.AMBIGUOUS, "httpx.ConnectError: All connection attempts failed")),
    (Conflict("Conflict: terminated by other getUpdates request"),
     CallResult(CallOutcome.REJECTED, "Conflict: terminated by other getUpdates request")),
    (ValueError(f"no token in here {'123456:ABC-secret'}"), CallResult(CallOutcome.AMBIGUOUS, "ValueError")),
], ids=["topic-not-modified", "message-not-modified", "thread-not-found", "topic-id-invalid", "topic-deleted",
        "bad-request-other", "forbidden", "timed-out", "network", "other-telegram-error", "unknown"])
def test_classify(error, expected):
    assert classify(error) == expected


def test_only_ok_and_not_modified_count_as_done():
    assert [o for o in CallOutcome if CallResult(o).ok] == [CallOutcome.OK, CallOutcome.NOT_MODIFIED]


@pytest.mark.parametrize("retry_after", [timedelta(seconds=7), 7])
def test_retry_after_with_ptb_timedelta(monkeypatch, retry_after):
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # PTB answers a timedelta (as `topicbus leader` sets it)
    error = RetryAfter(retry_after)
    assert isinstance(error.retry_after, timedelta)
    assert retry_after_seconds(error) == 7.0
    assert classify(error) == CallResult(CallOutcome.RETRY_AFTER, "Flood control exceeded. Retry in 0:00:07",
                                         retry_after_s=7.0)


def test_retry_after_as_a_number(monkeypatch):
    monkeypatch.delenv("PTB_TIMEDELTA", raising=False)  # PTB answers an int (with a deprecation warning)
    with pytest.warns(PTBDeprecationWarning):
        error = RetryAfter(timedelta(seconds=3))
        assert isinstance(error.retry_after, int)
        assert retry_after_seconds(error) == 3.0
        assert classify(error).retry_after_s == 3.0
        assert classify(error).outcome is CallOutcome.RETRY_AFTER


def test_the_leader_command_sets_ptb_timedelta_when_it_starts_and_importing_topicbus_does_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PTB_TIMEDELTA's one home is `topicbus leader`'s start: not an import (whose environment
    `follow`'s agents would inherit), not the Makefile or the Docker image."""
    environment = {k: v for k, v in os.environ.items() if k != "PTB_TIMEDELTA" and not k.startswith("TOPICBUS_")}
    imported = subprocess.run(
        [sys.executable, "-c", "import os, topicbus.cli; print(os.environ.get('PTB_TIMEDELTA'))"],
        env=environment, capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "None"

    monkeypatch.delenv("PTB_TIMEDELTA", raising=False)
    for name in [n for n in os.environ if n.startswith("TOPICBUS_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env: the leader exits 2 for want of configuration, after the setting
    with pytest.raises(SystemExit):
        cli.cmd_leader()
    assert os.environ["PTB_TIMEDELTA"] == "true"


def test_an_operators_own_ptb_timedelta_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "false")
    for name in [n for n in os.environ if n.startswith("TOPICBUS_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        cli.cmd_leader()
    assert os.environ["PTB_TIMEDELTA"] == "false"
