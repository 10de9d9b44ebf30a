"""Settings validation and the operator-facing status rendering."""

from __future__ import annotations

import pytest

from topicbus.settings import ConfigurationError, load_settings
from topicbus.core.board import render_board, render_text
from topicbus.status_json import status_report

TOKEN = "123456:settings-test-token-value-000000000"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("TOPICBUS_")]:
        monkeypatch.delenv(name)


def test_secrets_never_appear_in_repr_or_str():
    s = load_settings(None, bot_token=TOKEN, bus_secret="bus-secret-value")
    assert TOKEN not in repr(s) and "bus-secret-value" not in repr(s) and TOKEN not in str(s)
    assert s.secrets() == [TOKEN, "bus-secret-value"]


def test_invalid_values_are_named_by_variable_without_echoing_input(monkeypatch):
    monkeypatch.setenv("TOPICBUS_BUS_PORT", "99999")
    monkeypatch.setenv("TOPICBUS_OWNER_IDS", "1,two")
    monkeypatch.setenv("TOPICBUS_DISPLAY_MODE", "rainbow")
    with pytest.raises(ConfigurationError) as info:
        load_settings(None)
    names = sorted(line.split(":", 1)[0] for line in info.value.problems)
    assert names == ["TOPICBUS_BUS_PORT", "TOPICBUS_DISPLAY_MODE", "TOPICBUS_OWNER_IDS"]
    assert all("rainbow" not in line and "two" not in line for line in info.value.problems)


def test_leader_requires_token_chat_and_owners_but_not_the_bus_secret():
    s = load_settings(None)
    assert [p.split(":")[0] for p in s.leader_problems()] == [
        "TOPICBUS_BOT_TOKEN", "TOPICBUS_CHAT_ID", "TOPICBUS_OWNER_IDS"]
    ok = load_settings(None, bot_token=TOKEN, chat_id=-100, owner_ids="1, 2")
    assert ok.leader_problems() == [] and ok.owner_ids == frozenset({1, 2})
    assert ok.display_mode is None and ok.thread_cleanup is True  # None: the database's default mode


def test_status_renders_a_standby_without_a_live_view():
    text = render_text(status_report({"role": "standby", "epoch": 3, "followers": [], "bindings": []}))
    assert "standby" in text and "no live view" in text and "(none)" in text


def test_status_board_fits_a_phone_and_lists_slots_states_backlog_and_rotation():
    board = render_board(status_report({
        "role": "leader", "epoch": 2, "cleanupPolicy": "off", "displayMode": "letters",
        "budget": {"usedLastMinute": 7, "perMinute": 20.0, "pausedForS": 12.0},
        "bindings": [
            {"slot": "A", "title": "topicbus control", "state": "control", "heartbeatAgeMs": None, "queued": 0},
            {"slot": "B", "title": "a rather long project title", "state": "live", "heartbeatAgeMs": 1200,
             "queued": 2, "outboxItems": 31, "outboxUnits": 12_345},
            {"slot": "C", "title": "C", "state": "preserved", "heartbeatAgeMs": None, "queued": 0},
            {"slot": "D", "title": "gone", "state": "deleted", "heartbeatAgeMs": None, "queued": 0},
            {"slot": "E", "title": "finished", "state": "ending", "heartbeatAgeMs": None, "queued": 0,
             "deletesInMs": 540_000},
        ],
        "rotation": {"slotsUsed": 3, "rotationOrder": [{"slot": "C", "protection": "eligible"}],
                     "fence": {"slot": "D", "phase": "deletion-issued", "threadId": 9}},
        "pendingCleanups": [], "pendingObservations": [],
    }))
    lines = board.splitlines()
    assert all(len(line) <= 36 for line in lines), [line for line in lines if len(line) > 36]
    assert "cleanup off" in lines[1] and "budget 7/20 a min · wait 12s" in lines
    assert any(line.startswith("B a rather long pro") and "live" in line and "1s" in line for line in lines)
    assert "  out 31 (12.3k ch) · in 2" in lines
    assert any(line.startswith("C ") and "kept" in line for line in lines)
    assert any(line.startswith("E finished") and line.endswith("ends in    9m") for line in lines), lines
    assert not any("gone" in line for line in lines)  # deleted bindings are left out
    assert "slots 3/26 · next C" in lines and "retiring D: deletion-issued" in lines
