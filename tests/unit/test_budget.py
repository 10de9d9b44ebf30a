"""The chat's budget: a sliding window, one a second, a reserve, and RetryAfter (pure, clock passed in)."""

from __future__ import annotations

import pytest

from topicbus.core.budget import BudgetConfig, ChatBudget, Priority

GROUP = BudgetConfig(per_minute=20, per_second=1, reserve=4, window_s=60, overall_per_second=30)


def spend_until_blocked(budget: ChatBudget, priority: Priority, start: float = 0.0) -> float:
    """Spend as soon as allowed; return the time the budget first refuses within the window."""
    now = start
    while (at := budget.ready_at(now, priority)) < start + 60:
        now = at
        budget.record(now, spends=True)
    return now


def test_one_spend_a_second() -> None:
    budget = ChatBudget(GROUP)
    budget.record(10.0, spends=True)
    assert budget.ready_at(10.0, Priority.CONTROL) == 11.0
    assert budget.ready_at(10.5, Priority.OUTPUT) == 11.0


def test_output_stops_at_the_reserve_and_control_may_spend_it() -> None:
    budget = ChatBudget(GROUP)
    spend_until_blocked(budget, Priority.OUTPUT)
    assert budget.used(16.0) == 16  # 20 a minute minus the reserve of 4
    assert budget.ready_at(16.0, Priority.OUTPUT) == 60.0  # the first spend leaves the window at 60 s
    assert budget.ready_at(16.0, Priority.CONTROL) == 16.0  # the reserve is the control answers'
    assert budget.ready_at(16.0, Priority.ANSWER) == 16.0
    assert budget.ready_at(16.0, Priority.TITLE) == 60.0
    assert budget.under_pressure(16.0)


def test_control_spends_come_out_of_the_reserve_so_output_keeps_its_share() -> None:
    budget = ChatBudget(GROUP)
    for second in range(4):  # the control topic answered four times: the reserve is used up
        budget.record(float(second), spends=True, priority=Priority.CONTROL)
    now = 4.0
    while (at := budget.ready_at(now, Priority.OUTPUT)) < 60:
        now = at
        budget.record(now, spends=True)
    assert budget.used(now) == 20  # output may take the other 16 in full, not 16 minus what control spent
    budget2 = ChatBudget(GROUP)
    budget2.record(0.0, spends=True, priority=Priority.ANSWER)  # one of the four reserved spent
    for second in range(1, 40):
        if budget2.ready_at(float(second), Priority.OUTPUT) == float(second):
            budget2.record(float(second), spends=True)
    assert budget2.used(40.0) == 17  # output took 16, its share; the reserve keeps three more
    assert budget2.ready_at(40.0, Priority.OUTPUT) == 60.0
    assert budget2.ready_at(40.0, Priority.CONTROL) == 40.0


def test_the_window_slides() -> None:
    budget = ChatBudget(GROUP)
    for second in range(20):
        budget.record(float(second), spends=True)
    assert budget.ready_at(20.0, Priority.CONTROL) == 60.0  # 20 spends in the window: wait for the first
    assert budget.ready_at(20.0, Priority.OUTPUT) == 64.0  # output may use only 16 of them
    assert budget.used(60.0) == 19


def test_calls_that_do_not_spend_only_honour_the_pause_and_the_bot_rate() -> None:
    budget = ChatBudget(GROUP)
    spend_until_blocked(budget, Priority.CONTROL)
    assert budget.ready_at(30.0, Priority.OUTPUT, spends=False) == 30.0
    budget.record(30.0, spends=False)
    assert budget.ready_at(30.0, Priority.OUTPUT, spends=False) == pytest.approx(30.0 + 1 / 30)
    budget.pause(31.0, 5.0)
    assert budget.ready_at(31.0, Priority.BACKGROUND, spends=False) == 36.0
    assert budget.retry_after_hits == 1


def test_retry_after_pauses_everything_and_never_shortens_a_pause() -> None:
    budget = ChatBudget(GROUP)
    budget.pause(0.0, 50.0)
    budget.pause(1.0, 2.0)
    assert budget.ready_at(1.0, Priority.CONTROL) == 50.0


def test_private_chats_have_no_window() -> None:
    config = BudgetConfig.for_chat(4242, per_minute=20, per_second=1, reserve=4, overall_per_second=30)
    assert config.per_minute is None
    budget = ChatBudget(config)
    for second in range(100):
        assert budget.ready_at(float(second), Priority.OUTPUT) == float(second)
        budget.record(float(second), spends=True)


def test_a_group_keeps_the_window_and_a_reserve_below_it() -> None:
    config = BudgetConfig.for_chat(-100123, per_minute=3, per_second=1, reserve=4, overall_per_second=30)
    assert config.per_minute == 3 and config.reserve == 2  # output always keeps at least one


def test_the_per_second_spacing_alone_is_not_pressure() -> None:
    budget = ChatBudget(GROUP)
    budget.record(10.0, spends=True)
    budget.record(10.01, spends=False)  # a reaction right after a message
    assert budget.ready_at(10.02, Priority.OUTPUT) == 11.0
    assert not budget.under_pressure(10.02)  # reactions and chat actions still go


def test_a_call_that_can_wait_leaves_headroom_in_the_window_for_other_output() -> None:
    budget = ChatBudget(GROUP)
    now = 0.0
    while (at := budget.ready_at(now, Priority.OUTPUT, headroom=4)) < 60:
        now = at
        budget.record(now, spends=True)
    assert budget.used(now) == 12  # 20 a minute, 4 reserved for control, 4 left to other output
    assert budget.ready_at(now + 1, Priority.OUTPUT) == now + 1  # other output goes at once
    assert budget.ready_at(now + 1, Priority.OUTPUT, headroom=4) == 60.0  # the screen waits for a slot
    assert budget.ready_at(0, Priority.OUTPUT, headroom=99) >= 0  # never more headroom than the limit allows
