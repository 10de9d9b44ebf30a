"""A topic's next send: coalescing, files, growing messages, notifications (pure)."""

from __future__ import annotations

from topicbus.core.budget import Priority
from topicbus.core.output import (AsFile, EditScreen, Extend, Idle, LiveMessage, NewMessage, NewScreen, OutputConfig,
                                  Ping, QueuedItem, Single, StreamState, TopicTurn, Unbutton, Wait, plan, prompt_only)

CFG = OutputConfig(max_message=100, file_threshold=300, live_window_ms=60_000, edit_interval_ms=4_000, quiet_ms=3_000)


def text(item_id: int, units: int = 10, *, fmt: str | None = "pre", kind: str = "text",
         buttons: bool = False, arrived_ms: int = 10_000) -> QueuedItem:
    priority = Priority.CONTROL if kind == "notice" else Priority.OUTPUT
    return QueuedItem(item_id, kind, units, fmt, priority, arrived_ms, buttons)


def streaming(*, last_output_ms: int, live_units: int = 20, started_ms: int = 0, last_edit_ms: int = 0) -> StreamState:
    return StreamState(last_sent_ms=last_output_ms, last_output_ms=last_output_ms,
                       live=LiveMessage(7, "pre", "x" * live_units, live_units, started_ms, last_edit_ms))


def test_an_answer_that_fits_goes_at_once_and_notifies() -> None:
    step = plan([text(1), text(2)], StreamState(), 10_000, CFG)
    assert step == NewMessage((text(1), text(2)), notify=True)


def test_items_are_packed_whole_up_to_the_message_size_and_the_rest_waits() -> None:
    queue = [text(i, 30) for i in range(1, 6)]  # 5 × 30 units + separators
    step = plan(queue, StreamState(), 10_000, CFG)
    assert step == NewMessage(tuple(queue[:3]), notify=False)  # 30+1+30+1+30 = 92 ≤ 100; more is waiting


def test_formats_notices_buttons_and_files_are_never_mixed_into_one_message() -> None:
    assert plan([text(1), text(2, fmt="markdown")], StreamState(), 0, CFG) == NewMessage((text(1),), notify=False)
    assert plan([text(1, kind="notice"), text(2)], StreamState(), 0, CFG) == NewMessage(
        (text(1, kind="notice"),), notify=True)
    assert plan([text(1, buttons=True), text(2)], StreamState(), 0, CFG) == NewMessage(
        (text(1, buttons=True),), notify=True)
    document = QueuedItem(1, "document", 0, None, Priority.OUTPUT, 0)
    assert plan([document, text(2)], StreamState(), 0, CFG) == Single(document)


def test_a_long_backlog_becomes_one_file() -> None:
    queue = [text(i, 50) for i in range(1, 9)]  # 8 × 50 units > 300
    assert plan(queue, StreamState(), 0, CFG) == AsFile(tuple(queue))
    assert plan(queue, StreamState(), 0, OutputConfig(max_message=100, file_threshold=0)) == NewMessage(
        tuple(queue[:1]), notify=False)  # 0 turns files off


def test_a_slow_stream_grows_its_message_by_edits_at_most_every_interval() -> None:
    stream = streaming(last_output_ms=9_000, last_edit_ms=8_000)
    assert plan([text(1)], stream, 10_000, CFG) == Wait(12_000)
    # Waiting for the edit turn does not end the stream: the burst is measured between outputs.
    assert plan([text(1)], stream, 12_000, CFG) == Extend((text(1),))


def test_no_edit_when_the_message_is_full_old_or_the_stream_had_paused() -> None:
    assert plan([text(1, 90)], streaming(last_output_ms=9_000), 12_000, CFG) == NewMessage(
        (text(1, 90),), notify=False)
    old = streaming(last_output_ms=61_000, started_ms=0)
    assert isinstance(plan([text(1, arrived_ms=62_000)], old, 62_000, CFG), NewMessage)
    paused = streaming(last_output_ms=1_000)  # the output came more than 3 s after the last: a new answer
    assert plan([text(1)], paused, 12_000, CFG) == NewMessage((text(1),), notify=True)
    assert isinstance(plan([text(1)], streaming(last_output_ms=9_000), 12_000,
                           OutputConfig(max_message=100, live_window_ms=0)), NewMessage)


def test_a_silent_stream_ends_with_one_ping_after_the_quiet_time() -> None:
    turn = TopicTurn()
    turn.sent_message(1_000, notify=False, message_id=5, fmt="pre", raw="a\nlast line", units=11, growable=True,
                      arrived_ms=900)
    assert plan([], turn.stream, 2_000, CFG) == Wait(4_000)
    assert plan([], turn.stream, 4_000, CFG) == Ping()
    assert turn.ping_text() == "✓ last line"
    turn.pinged(4_000)
    assert plan([], turn.stream, 9_000, CFG) == Idle()


def test_a_notifying_message_owes_no_ping_and_an_edit_does() -> None:
    turn = TopicTurn()
    turn.sent_message(1_000, notify=True, message_id=5, fmt="pre", raw="4", units=1, growable=True)
    assert plan([], turn.stream, 10_000, CFG) == Idle()
    turn.extended(2_000, "4\n5", 3)
    assert plan([], turn.stream, 10_000, CFG) == Ping()


def test_only_growable_messages_become_live() -> None:
    turn = TopicTurn()
    turn.sent_message(1_000, notify=True, message_id=5, fmt=None, raw="hi", units=2, growable=False)
    assert turn.stream.live is None


def test_after_the_owner_spoke_output_starts_a_new_notifying_message_below_and_no_ping_is_owed() -> None:
    turn = TopicTurn(streaming(last_output_ms=9_000, last_edit_ms=0))
    turn.stream.owes_ping = True
    assert plan([text(1, arrived_ms=9_500)], turn.stream, 10_000, CFG) == Extend((text(1, arrived_ms=9_500),))
    turn.owner_spoke()
    assert plan([text(1, arrived_ms=9_500)], turn.stream, 10_000, CFG) == NewMessage(
        (text(1, arrived_ms=9_500),), notify=True)
    assert plan([], turn.stream, 60_000, CFG) == Idle()


def test_a_send_the_owner_spoke_during_is_never_grown_and_owes_no_ping() -> None:
    turn = TopicTurn()
    began = turn.stream.owner_turns  # the message is on its way ...
    turn.owner_spoke()  # ... when the owner's message arrives; it then lands above the owner's
    turn.sent_message(1_000, notify=False, message_id=5, fmt="pre", raw="READY", units=5, growable=True,
                      arrived_ms=900, owner_turns=began)
    assert turn.stream.live is None and not turn.stream.owes_ping
    assert plan([text(1, arrived_ms=1_200)], turn.stream, 1_300, CFG) == NewMessage((text(1, arrived_ms=1_200),),
                                                                                   notify=True)
    # An edit in flight when the owner spoke: the message stays where it is, nothing grows it further.
    live = TopicTurn(streaming(last_output_ms=9_000))
    began = live.stream.owner_turns
    live.owner_spoke()
    live.extended(10_000, "x\ny", 3, arrived_ms=9_500, owner_turns=began)
    assert live.stream.live is None and not live.stream.owes_ping and live.stream.last_output_ms is None


def test_the_end_of_a_stream_goes_as_one_notifying_message_and_owes_no_ping() -> None:
    # Mid-stream (a live message to grow, the burst going on), then the follower leaves: what is left
    # goes as one notifying message, not an edit or a silent message followed by a ping repeating it.
    live = streaming(last_output_ms=9_000, started_ms=8_000, last_edit_ms=0)
    exit_notice = text(3, 30, fmt="plain", arrived_ms=9_500)
    assert plan([text(1), text(2)], live, 10_000, CFG) == Extend((text(1), text(2)))
    turn = TopicTurn(live)
    turn.follower_left()
    assert plan([text(1), text(2)], turn.stream, 10_000, CFG) == NewMessage((text(1), text(2)), notify=True)
    # A run of another format first goes as usual; the last one then notifies.
    assert plan([text(1), exit_notice], turn.stream, 10_000, CFG) == Extend((text(1),))
    assert plan([exit_notice], turn.stream, 10_000, CFG) == NewMessage((exit_notice,), notify=True)
    turn.sent_message(10_000, notify=True, message_id=9, fmt="plain", raw="⏹ exited", units=8, growable=True)
    assert not turn.stream.owes_ping and not turn.stream.ending
    assert plan([], turn.stream, 60_000, CFG) == Idle()  # no "✓" line afterwards
    # What does not fit in one message is packed as usual (silent), the rest waits for its turn.
    turn.follower_left()
    long = [text(i, 60, arrived_ms=9_900) for i in range(1, 4)]
    assert plan(long, turn.stream, 10_000, CFG) == NewMessage((long[0],), notify=False)


def frame(item_id: int, arrived_ms: int = 10_000) -> QueuedItem:
    return QueuedItem(item_id, "text", 50, "pre", Priority.OUTPUT, arrived_ms, screen=True)


def test_screen_frames_make_one_message_edited_in_place_with_the_newest_frame() -> None:
    turn = TopicTurn()
    assert plan([frame(1), frame(2)], turn.stream, 10_000, CFG) == NewScreen((frame(1), frame(2)), notify=True)
    turn.screen_sent(10_000, notify=True, message_id=9, raw="frame 2", arrived_ms=10_000)
    assert not turn.stream.owes_ping and turn.stream.live is None
    queue = [frame(3, 11_000), frame(4, 12_000), frame(5, 13_000)]
    assert plan(queue, turn.stream, 12_000, CFG) == Wait(14_000)  # the live-message edit cadence
    assert plan(queue, turn.stream, 14_000, CFG) == EditScreen(tuple(queue))  # all settled, the last shown
    turn.screen_edited(14_000, "frame 5", 13_000)
    assert not turn.stream.owes_ping  # edits of a screen never ping
    turn.owner_spoke()  # the owner's keys are the program's: its frames still edit the same message
    assert plan([frame(6, 15_000)], turn.stream, 18_000, CFG) == EditScreen((frame(6, 15_000),))


def test_a_frame_with_output_behind_it_is_the_last_and_goes_at_once_then_the_screen_ends() -> None:
    turn = TopicTurn()
    turn.screen_sent(10_000, notify=True, message_id=9, raw="frame 1", arrived_ms=10_000)
    queue = [frame(2, 10_500), text(3, arrived_ms=10_600)]
    assert plan(queue, turn.stream, 10_700, CFG) == EditScreen((frame(2, 10_500),))  # no wait for the cadence
    assert plan([text(3)], turn.stream, 10_700, CFG) == NewMessage((text(3),), notify=False)
    turn.sent_message(11_000, notify=False, message_id=10, fmt="pre", raw="x", units=10, growable=True)
    assert turn.stream.screen is None  # the next frame starts a new screen message below
    assert plan([frame(4, 12_000)], turn.stream, 12_000, CFG) == NewScreen((frame(4, 12_000),), notify=False)


def test_frames_are_never_coalesced_with_output() -> None:
    assert plan([text(1), frame(2)], StreamState(), 10_000, CFG) == NewMessage((text(1),), notify=False)


def test_only_a_running_streams_latest_message_keeps_its_interrupt_button() -> None:
    turn = TopicTurn()
    turn.sent_message(1_000, notify=False, message_id=5, fmt="pre", raw="a", units=1, growable=True, arrived_ms=1_000)
    turn.carried_button(5, True)
    assert plan([], turn.stream, 1_500, CFG) == Wait(4_000)  # the stream runs: its one button stays
    turn.sent_message(2_000, notify=False, message_id=6, fmt="pre", raw="b", units=1, growable=True, arrived_ms=2_000)
    turn.carried_button(6, True)
    assert plan([text(9)], turn.stream, 2_100, CFG) != Unbutton(5)  # output first
    assert plan([], turn.stream, 2_100, CFG) == Unbutton(5)  # tidying, while the ping is not due yet
    turn.carried_button(5, False)
    assert plan([], turn.stream, 2_100, CFG) == Wait(5_000)
    assert plan([], turn.stream, 5_000, CFG) == Ping()
    turn.pinged(5_000)
    assert plan([], turn.stream, 5_000, CFG) == Unbutton(6)  # the stream ended: no button stays
    turn.carried_button(6, False)
    assert plan([], turn.stream, 5_000, CFG) == Idle()


def test_an_edit_without_the_button_takes_it_off_and_the_owner_ends_the_turn() -> None:
    turn = TopicTurn()
    turn.sent_message(1_000, notify=False, message_id=5, fmt="pre", raw="a", units=1, growable=True, arrived_ms=1_000)
    turn.carried_button(5, True)
    turn.extended(5_000, "a\nb", 3, arrived_ms=5_000)
    turn.carried_button(5, False)  # the edit went out without it (its process is gone)
    assert turn.stream.buttons == []
    turn.carried_button(5, True)
    turn.owner_spoke()
    assert plan([], turn.stream, 5_100, CFG) == Unbutton(5)


def test_a_prompt_is_one_short_line_that_ends_like_a_shells_or_a_repls() -> None:
    for prompt in ("root@vm:/tmp/shop#", "user@host:~$ ", ">>>", "sqlite>", "...", "> ", "% "):
        assert prompt_only(prompt), prompt
    for text in ("built 3 targets", "line 1\nroot@vm:/tmp/shop#", "", "   ", "#" * 201, "done.",
                 "Downloading model.bin [#####.....]  46%", "99.5%"):  # a progress figure is no zsh prompt
        assert not prompt_only(text), text


def test_a_prompt_appended_by_an_edit_owes_no_ping_of_its_own() -> None:
    turn = TopicTurn()
    turn.sent_message(1_000, notify=True, message_id=5, fmt="pre", raw="built", units=5, growable=True,
                      arrived_ms=1_000)
    turn.extended(5_000, "built\n$", 7, arrived_ms=1_300, prompt=True)
    assert not turn.stream.owes_ping and plan([], turn.stream, 9_000, CFG) == Idle()
    turn.extended(9_000, "built\n$\nmore", 12, arrived_ms=9_000)
    assert turn.stream.owes_ping  # real output after it does
