"""Pure helpers of `topicbus follow`: text splitting, output batching, what a message types, exit codes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topicbus.follower.follow import exit_code_of, exit_notice
from topicbus.follower.inputs import Received, context_line, delivery_input, delivery_text, edit_text
from topicbus.follower.model import Delivery, Edit, split_text
from topicbus.follower.output import OutputBatcher, dropped_marker


def reassemble(text: str, chunks: list[str]) -> None:
    """Assert that ``chunks`` is ``text`` minus one consumed newline at some split points."""
    pos = 0
    for index, chunk in enumerate(chunks):
        assert text.startswith(chunk, pos), f"chunk {index} does not continue the input"
        pos += len(chunk)
        if index < len(chunks) - 1 or pos < len(text):
            if pos < len(text) and text[pos] == "\n":
                pos += 1  # the consumed split newline
    assert pos == len(text), "content lost at the end"


# ---- split_text -------------------------------------------------------------------------------


def test_split_short_and_empty() -> None:
    assert split_text("") == []
    assert split_text("hello") == ["hello"]
    assert split_text("a" * 4096) == ["a" * 4096]
    assert split_text("line\n") == ["line\n"]


def test_split_prefers_last_newline_and_consumes_it() -> None:
    text = "a" * 3000 + "\n" + "b" * 2000 + "\n" + "c" * 10
    assert split_text(text) == ["a" * 3000, "b" * 2000 + "\n" + "c" * 10]


def test_split_newline_exactly_at_limit() -> None:
    assert split_text("a" * 4096 + "\n" + "b") == ["a" * 4096, "b"]
    assert split_text("a" * 4096 + "\n") == ["a" * 4096]


def test_split_hard_when_no_newline() -> None:
    chunks = split_text("x" * 10_000)
    assert chunks == ["x" * 4096, "x" * 4096, "x" * 1808]


def test_split_leading_newline_is_not_an_empty_chunk() -> None:
    chunks = split_text("\n" + "x" * 5000, limit=4096)
    assert chunks == ["\n" + "x" * 4095, "x" * 905]


def test_split_small_limit_and_blank_lines() -> None:
    assert split_text("ab\n\ncd", limit=3) == ["ab\n", "cd"]
    assert split_text("\n\n\n\n", limit=2) == ["\n\n", "\n"]
    with pytest.raises(ValueError):
        split_text("x", limit=0)


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(["a", "b", " ", "\n", "é", "\r", "💡"]), max_size=200),
       limit=st.integers(min_value=1, max_value=40))
def test_split_properties(text: str, limit: int) -> None:
    chunks = split_text(text, limit)
    assert all(0 < len(c) <= limit for c in chunks)
    reassemble(text, chunks)
    consumed = len(text) - sum(len(c) for c in chunks)
    assert 0 <= consumed <= max(0, len(chunks))
    assert text.replace("\n", "") == "".join(chunks).replace("\n", "")


# ---- OutputBatcher ----------------------------------------------------------------------------


def test_batcher_flushes_when_output_pauses() -> None:
    b = OutputBatcher(max_batch_chars=100, flush_interval_s=0.25, max_delay_s=1.0)
    assert not b.ready(0.0) and b.take() is None and b.deadline() is None
    b.feed("hello\n", 10.0)
    b.feed("world\n", 10.1)
    assert not b.ready(10.3)  # 0.2 s since the last output: not a pause yet
    assert b.deadline() == pytest.approx(10.35)
    assert b.ready(10.35)
    assert b.take() == "hello\nworld\n"
    assert not b.has_pending and b.deadline() is None and b.pending_bytes == 0


def test_batcher_posts_a_stream_that_never_pauses_after_max_delay() -> None:
    b = OutputBatcher(max_batch_chars=1000, flush_interval_s=0.25, max_delay_s=1.0)
    for i in range(12):
        b.feed(f"tick {i}\n", 10.0 + i * 0.1)
        assert b.ready(10.0 + i * 0.1) == (i >= 10)
    assert b.deadline() == pytest.approx(11.0)


def test_batcher_flushes_on_size_preferring_newline() -> None:
    b = OutputBatcher(max_batch_chars=10, flush_interval_s=100)
    b.feed("abc\ndefgh", 0)
    assert not b.ready(0)
    b.feed("ij\nk", 0)
    assert b.ready(0)
    assert b.take() == "abc\n"
    assert b.take() == "defghij\nk"
    b.feed("y" * 25, 1)
    assert [b.take(), b.take(), b.take(), b.take()] == ["y" * 10, "y" * 10, "y" * 5, None]


def test_batcher_keeps_all_content() -> None:
    b = OutputBatcher(max_batch_chars=7, flush_interval_s=0)
    text = "".join(f"line {i}\n" if i % 3 else "x" * 11 for i in range(30))
    for i in range(0, len(text), 5):
        b.feed(text[i:i + 5], 0)
    out = []
    while (batch := b.take()) is not None:
        assert 0 < len(batch) <= 7
        out.append(batch)
    assert "".join(out) == text


def test_batcher_bounds_pending_output_with_one_marker() -> None:
    b = OutputBatcher(max_batch_chars=100, flush_interval_s=1, max_pending_bytes=10)
    b.feed("0123456789", 0)
    assert b.dropped_bytes == 0
    b.feed("abcd", 0)
    b.feed("ef", 0)
    assert b.pending_bytes == 10 and b.dropped_bytes == 6
    assert b.ready(0)
    assert b.take() == dropped_marker(6)
    assert b.take() == "6789abcdef"
    assert b.take() is None


def test_batcher_drop_never_splits_a_character() -> None:
    b = OutputBatcher(max_batch_chars=100, flush_interval_s=1, max_pending_bytes=8)
    b.feed("éééé", 0)  # 8 bytes
    b.feed("a", 0)  # 9 bytes: dropping 1 byte must drop the whole first "é"
    assert b.dropped_bytes == 2 and b.pending_bytes == 7
    assert b.take() == dropped_marker(2)
    assert b.take() == "éééa"


def test_dropped_marker_text() -> None:
    assert dropped_marker(42) == "[… 42 bytes of output dropped while the leader was unreachable]"


# ---- delivery lines and exit codes ------------------------------------------------------------


def _delivery(text=None, caption=None, document=None) -> Delivery:
    return Delivery(delivery_id="d", text=text, caption=caption, message_id=1, from_user_id=1, from_name="A",
                    date=0, document=document)


def test_delivery_text_keeps_lines() -> None:
    assert delivery_text(_delivery("a\r\nb\nc\rd")) == "a\nb\nc\nd"
    assert delivery_text(_delivery("one\n\ntwo  ")) == "one\n\ntwo  "  # nothing else altered
    assert delivery_text(_delivery(caption="cap\nx", document={"fileName": "f.txt"})) == "cap\nx"
    assert delivery_text(_delivery(document={"fileName": "f.txt"})) == "[document f.txt]"
    assert delivery_text(_delivery(caption="c", document={"fileName": "f"}),
                         Received("document", "f", path="/in/f")) == "[document /in/f] c"
    assert delivery_text(_delivery(caption="c", document={"fileName": "f"}),
                         Received("document", "f", problem="failed")) == "[document f failed] c"
    assert delivery_text(_delivery()) is None


def test_media_types_a_line_per_file_with_its_kind_and_the_caption_after_the_first() -> None:
    files = [{"fileId": "a", "fileName": None, "kind": "voice", "duration": 5, "tooLarge": False},
             {"fileId": "b", "fileName": "trip.jpg", "kind": "photo", "tooLarge": False},
             {"fileId": "c", "fileName": "demo.mp4", "kind": "video", "tooLarge": True},
             {"fileId": "d", "fileName": "x.mp4", "kind": "video_note", "tooLarge": False}]
    album = Delivery(delivery_id="d", text=None, caption="from the trip", message_id=1, from_user_id=1,
                     from_name="A", date=0, document=None, files=files)
    saved = [Received("voice", "unnamed", path="/in/1-1-voice.ogg"), Received("photo", "trip.jpg", path="/in/1-2-trip.jpg"),
             Received("video", "demo.mp4", problem="too large"), Received("video_note", "x.mp4", problem="failed")]
    assert delivery_text(album, saved_files=saved) == (
        "[voice /in/1-1-voice.ogg] from the trip\n[photo /in/1-2-trip.jpg]\n[video demo.mp4 too large]\n"
        "[video_note x.mp4 failed]")  # saved, saved, over 20 MB, not saved (the download failed)
    assert delivery_text(album, saved_files=[None, None, None, None]).splitlines()[2:] == [
        "[video demo.mp4 too large]", "[video_note x.mp4]"]  # not tried
    assert delivery_text(album, saved_files=[]) .splitlines()[0] == "[voice unnamed] from the trip"


def test_context_lines_say_what_was_replied_to_and_edits_are_marked() -> None:
    def replying(reply):
        return Delivery(delivery_id="d", text="why?", caption=None, message_id=2, from_user_id=1, from_name="A",
                        date=0, document=None, reply=reply)

    agent = {"messageId": 9, "text": "build finished: 3 warnings\nmore", "fromName": "Bot", "fromAgent": True}
    assert context_line(replying(agent)) == "[reply to the agent: build finished: 3 warnings]"
    assert context_line(replying({**agent, "quote": "3 warnings"})) == "[reply to the agent: 3 warnings]"
    assert context_line(replying({"messageId": 8, "text": None, "fromName": "Ann", "fromAgent": False})) == \
        "[reply to Ann]"
    assert context_line(replying({"messageId": 8, "text": "x" * 300, "fromAgent": False}), limit=10) == \
        "[reply to a message: xxxxxxxxx…]"
    assert context_line(replying(None)) is None
    assert edit_text(Edit(delivery_id="e", message_id=2, text="why 3 warnings?\r\nreally")) == \
        "[edit] why 3 warnings?\nreally"


def test_delivery_input() -> None:
    assert delivery_input("print(1)") == b"print(1)\n"
    block = "def f(x):\n    return x"
    assert delivery_input(block) == b"def f(x):\n    return x\n"
    assert delivery_input(block, end_blocks=True) == b"def f(x):\n    return x\n\n"
    assert delivery_input("one line", end_blocks=True) == b"one line\n"
    assert delivery_input("while True: pass", end_blocks=True) == b"while True: pass\n\n"
    assert delivery_input("while True: pass") == b"while True: pass\n"
    assert delivery_input("é") == "é\n".encode()


def test_exit_notice() -> None:
    assert exit_notice(3, 2.04) == "⏹ exited with code 3 after 2.0 s"
    assert exit_notice(0, 75) == "⏹ exited with code 0 after 1 min 15 s"
    assert exit_notice(-9, 12.4) == "⏹ killed by SIGKILL after 12 s"
    assert exit_notice(-15, 7300) == "⏹ killed by SIGTERM after 2 h 1 min"


def test_exit_code_of() -> None:
    assert exit_code_of(0) == 0
    assert exit_code_of(3) == 3
    assert exit_code_of(-15) == 143
    assert exit_code_of(-9) == 137


def test_default_instance_ids_differ_within_one_process_and_millisecond():
    from topicbus.follower.client import FollowerClient

    clients = [FollowerClient(leader_url="ws://127.0.0.1:1/v1/bus", secret="s" * 8, pid=42) for _ in range(50)]
    assert len({c.instance_id for c in clients}) == 50


def test_a_file_name_is_typed_clean_in_every_line() -> None:
    evil = "report.pdf\ntouch /tmp/X\n"
    files = [{"fileId": "a", "fileName": evil, "kind": "document", "tooLarge": True},
             {"fileId": "b", "fileName": evil, "kind": "document", "tooLarge": False},
             {"fileId": "c", "fileName": evil, "kind": "audio", "tooLarge": False}]
    delivery = Delivery(delivery_id="d", text=None, caption="the caption\nas written", message_id=5,
                        from_user_id=1, from_name="A", date=0, document=None, files=files)
    typed = delivery_text(delivery, saved_files=[None, Received("document", "report.pdf_touch _tmp_X_",
                                                                problem="failed")])
    assert typed.splitlines() == ["[document report.pdf_touch _tmp_X_ too large] the caption", "as written",
                                  "[document report.pdf_touch _tmp_X_ failed]", "[audio report.pdf_touch _tmp_X_]"]
    message = Delivery(delivery_id="e", text=None, caption=None, message_id=6, from_user_id=1, from_name="A",
                       date=0, document={"fileId": "f", "fileName": evil})
    assert delivery_text(message) == "[document report.pdf_touch _tmp_X_]"
