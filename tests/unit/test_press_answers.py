"""Answers to button presses: one alert a minute per stranger, presses of one button
merged, nothing sent past its deadline, a per-second cap, owners first (pure, clock passed in)."""

from __future__ import annotations

from topicbus.core.press_answers import Offer, PressAnswerConfig, PressAnswerQueue, scheduler_share

CHAT = -100
OWNER, STRANGER = 1, 666
CONFIG = PressAnswerConfig(per_second=5.0, answerable_s=14.0, same_button_interval_s=1.0, stranger_interval_s=60.0,
                           capacity=8)


def key(user: int, message: int = 10, data: str = "k:yes") -> tuple[int, int, int, str]:
    return (user, CHAT, message, data)


def drain(queue: PressAnswerQueue, start: float, end: float) -> list[tuple[float, str]]:
    """Take every answer the queue gives from ``start`` until ``end``, asking exactly when it says
    to; returns (time, query id) of each."""
    sent, now = [], start
    while now <= end:
        answer, next_at = queue.take(now)
        if answer is not None:
            sent.append((now, answer.query_id))
            continue
        if next_at == float("inf"):
            break
        now = next_at
    return sent


def test_a_strangers_storm_gets_one_alert_a_minute_and_nothing_else() -> None:
    queue = PressAnswerQueue(CONFIG)
    offers = [queue.offer(i * 0.004, key(STRANGER), f"q{i}", "owners only", alert=True, by_owner=False,
                          arrived_at=i * 0.004) for i in range(500)]  # 500 presses in 2 s
    assert offers[0] is Offer.QUEUED and set(offers[1:]) == {Offer.LIMITED}
    assert drain(queue, 2.0, 59.0) == [(2.0, "q0")]
    # Other buttons, other messages: still the same stranger, still no second alert this minute.
    assert queue.offer(30.0, key(STRANGER, 11, "k:no"), "q-other", "owners only", alert=True, by_owner=False,
                       arrived_at=30.0) is Offer.LIMITED
    # A minute after the alert was queued: one more.
    assert queue.offer(60.5, key(STRANGER), "q-later", "owners only", alert=True, by_owner=False,
                       arrived_at=60.5) is Offer.QUEUED
    assert drain(queue, 60.5, 120.0) == [(60.5, "q-later")]
    assert queue.counts == {"queued": 2, "limited": 500, "sent": 2}


def test_presses_of_one_button_are_merged_and_the_latest_press_is_answered() -> None:
    queue = PressAnswerQueue(CONFIG)

    def burst(first: int, last: int) -> list[Offer]:
        return [queue.offer(i * 0.004, key(OWNER), f"q{i}", "already", alert=True, by_owner=True,
                            arrived_at=i * 0.004) for i in range(first, last + 1)]

    assert burst(0, 0) == [Offer.QUEUED]
    answer, _ = queue.take(0.0)
    assert answer is not None and answer.query_id == "q0"
    # The burst goes on (500 presses in 2 s): each press replaces the answer waiting for that button,
    # which goes one second after the button's last answer, for the latest press.
    assert burst(1, 249) == [Offer.QUEUED] + [Offer.REPLACED] * 248
    assert queue.take(0.5) == (None, 1.0)
    answer, _ = queue.take(1.0)
    assert answer is not None and answer.query_id == "q249"
    assert burst(250, 499) == [Offer.QUEUED] + [Offer.REPLACED] * 249
    assert drain(queue, 2.0, 30.0) == [(2.0, "q499")]
    assert queue.counts == {"queued": 3, "replaced": 497, "sent": 3} and len(queue) == 0


def test_another_button_of_the_same_message_is_answered_on_its_own() -> None:
    queue = PressAnswerQueue(CONFIG)
    for i, data in enumerate(("k:a", "garbage", "k:b")):
        assert queue.offer(0.0, key(OWNER, 10, data), f"q{i}", "stale", alert=True, by_owner=True,
                           arrived_at=0.0) is Offer.QUEUED
    assert [q for _, q in drain(queue, 0.0, 5.0)] == ["q0", "q1", "q2"]


def test_an_answer_past_its_deadline_is_dropped_not_sent_late() -> None:
    queue = PressAnswerQueue(CONFIG)
    # Arrived 20 s ago (a batch handled late): never queued.
    assert queue.offer(20.0, key(OWNER), "old", "sent", alert=False, by_owner=True, arrived_at=0.0) is Offer.EXPIRED
    # Queued in time, but Telegram asked the bot to wait (RetryAfter) beyond the deadline.
    assert queue.offer(20.0, key(OWNER, 11), "q1", "sent", alert=False, by_owner=True, arrived_at=19.5) is Offer.QUEUED
    queue.pause(20.0, 30.0)
    assert queue.take(20.0) == (None, 50.0)
    assert queue.take(50.0) == (None, float("inf"))
    assert queue.counts == {"expired": 1, "queued": 1, "late": 1}


def test_an_answer_refused_with_retry_after_waits_for_the_pause_and_keeps_its_deadline() -> None:
    queue = PressAnswerQueue(CONFIG)
    queue.offer(0.0, key(OWNER), "q0", "sent", alert=False, by_owner=True, arrived_at=0.0)
    answer, _ = queue.take(0.0)
    assert answer is not None
    queue.pause(0.1, 3.0)
    queue.retry(answer)
    assert queue.take(1.0) == (None, 3.1)
    again, _ = queue.take(3.1)
    assert again == answer
    # A newer press of the same button replaced it meanwhile: the refused answer is not put back.
    queue.pause(3.2, 1.0)
    queue.offer(3.3, key(OWNER), "q1", "already", alert=True, by_owner=True, arrived_at=3.3)
    queue.retry(again)
    assert [q for _, q in drain(queue, 3.3, 20.0)] == ["q1"]


def test_answers_go_at_most_per_second_owners_first() -> None:
    queue = PressAnswerQueue(CONFIG)
    for user in range(100, 104):  # four strangers, one alert each
        queue.offer(0.0, key(user), f"s{user}", "owners only", alert=True, by_owner=False, arrived_at=0.0)
    queue.offer(0.0, key(OWNER), "owner", "sent", alert=False, by_owner=True, arrived_at=0.0)
    sent = drain(queue, 0.0, 10.0)
    assert [q for _, q in sent] == ["owner", "s100", "s101", "s102", "s103"]
    assert [round(t, 3) for t, _ in sent] == [0.0, 0.2, 0.4, 0.6, 0.8]


def test_the_lane_is_bounded_and_an_owner_takes_a_strangers_place() -> None:
    queue = PressAnswerQueue(CONFIG)
    for user in range(100, 100 + CONFIG.capacity):
        assert queue.offer(0.0, key(user), f"s{user}", "x", alert=True, by_owner=False, arrived_at=0.0) is Offer.QUEUED
    assert queue.offer(0.0, key(999), "late", "x", alert=True, by_owner=False, arrived_at=0.0) is Offer.FULL
    assert queue.offer(0.0, key(OWNER), "owner", "sent", alert=False, by_owner=True, arrived_at=0.0) is Offer.QUEUED
    assert len(queue) == CONFIG.capacity
    sent = [q for _, q in drain(queue, 0.0, 60.0)]
    assert sent[0] == "owner" and "s100" not in sent and len(sent) == CONFIG.capacity


def test_the_lane_takes_a_small_share_of_the_bots_calls_and_the_scheduler_keeps_the_rest() -> None:
    lane = PressAnswerConfig.within(30.0)
    assert lane.per_second == 5.0 and scheduler_share(30.0, lane) == 25.0
    small = PressAnswerConfig.within(6.0)
    assert small.per_second == 1.0 and scheduler_share(6.0, small) == 5.0
