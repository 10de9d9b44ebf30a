"""What `topicbus follow` makes of a child's output: pipe-mode cleaning, pty rendering (pyte), prompts."""

from __future__ import annotations

from topicbus.follower.child import child_environment
from topicbus.follower.hardening import forget_secret_environment
from topicbus.follower.output import (
    DROPPED_BACKLOG,
    DROPPED_UNREACHABLE,
    MAX_LINE_CHARS,
    STDERR_MARK,
    LineCleaner,
    OutputBatcher,
    dropped_marker,
    render_line,
    strip_escapes,
    yes_no_buttons,
)
from topicbus.follower.terminal import ScreenRenderer

# ---- pipe mode ----------------------------------------------------------------------------------


def test_escapes_are_stripped() -> None:
    assert strip_escapes("\x1b[1;32mREADY\x1b[0m") == "READY"
    assert strip_escapes("\x1b]0;title\x07text") == "text"
    assert strip_escapes("a\x1b[2Kb\x1b[10;4Hc\x1b(Bd") == "abcd"
    assert render_line("\x1b[31merror\x1b[39m: x") == "error: x"


def test_carriage_returns_and_backspaces_leave_the_final_state() -> None:
    bar = "".join(f"\r[{'#' * i}{' ' * (10 - i)}] {i * 10}%" for i in range(11))
    assert render_line(bar) == "[##########] 100%"
    assert render_line("spinning |\b/\b-\b\\\bdone") == "spinning done"
    assert render_line("abc\r\n") == "abc"
    assert render_line("long text\rshort") == "shorttext"  # as a terminal leaves it
    assert render_line("bell\x07 tab\tkept") == "bell tab\tkept"


def test_cleaner_releases_lines_at_once_and_the_partial_line_when_quiet() -> None:
    c = LineCleaner(quiet_s=0.25, redraw_quiet_s=2.0)
    assert c.feed("one\ntw") == "one\n"
    assert c.take_partial(0.1) == ""
    assert c.take_partial(0.3) == "tw"
    assert c.feed("o\n") == "o\n"  # the rest of that line
    c.feed("\x1b[32m[###  ]\x1b[0m 60%\r[#####] 100%")
    assert c.take_partial(0.5) == ""  # a bar being redrawn waits longer
    assert c.take_partial(2.0) == "[#####] 100%"
    assert c.feed("\x1b[") == "" and c.take_partial(5, force=True) == ""  # an unfinished escape is dropped


def test_stderr_lines_are_marked() -> None:
    c = LineCleaner(mark=STDERR_MARK)
    assert c.feed("Traceback\n  File x\n") == f"{STDERR_MARK}Traceback\n{STDERR_MARK}  File x\n"
    c.feed(">>> ")
    assert c.take_partial(1) == f"{STDERR_MARK}>>>"
    assert c.feed("NameError\n") == f"{STDERR_MARK}NameError\n"  # the rest of that line, posted apart
    assert c.feed("\n") == "\n"  # an empty line gets no mark


def test_a_line_longer_than_a_message_is_output_in_pieces_never_held_whole() -> None:
    c = LineCleaner(max_line_chars=10)
    assert c.feed("abcdefgh") == ""  # held: within the limit
    assert c.feed("ijk") == "abcdefghijk"  # past it: output, and the line goes on
    assert not c.has_partial and c.line_open
    assert c.feed("x" * 25) == "x" * 25
    assert c.feed("tail  ") == ""
    assert c.feed("\n") == "tail\n"  # the end of the line; trailing spaces go as before
    assert not c.line_open


def test_a_6_mb_line_passes_whole_in_pieces_of_at_most_one_read_plus_the_limit() -> None:
    c = LineCleaner()
    line = "".join(f"{n:08x}" for n in range(6 * 1024 * 1024 // 8))
    read = 64 * 1024
    out = []
    for start in range(0, len(line), read):
        piece = c.feed(line[start:start + read])
        assert len(piece) <= MAX_LINE_CHARS + read
        out.append(piece)
    out.append(c.feed("\n"))
    assert "".join(out) == line + "\n"


def test_a_long_line_keeps_its_cleaning_across_reads() -> None:
    c = LineCleaner(max_line_chars=10, mark=STDERR_MARK)
    # An escape sequence cut between two reads is still removed; the mark comes once per line.
    assert c.feed("\x1b[3") == ""
    assert c.feed("1mred\x1b[0m and more") == f"{STDERR_MARK}red and more"
    assert c.feed("\rXY") == ""  # a carriage return returns to the start of what is held
    assert c.feed("Z\n") == "XYZ\n"  # the rest of the line is not marked again
    # A bar redrawn thousands of times is held as what it shows, not as everything written.
    bar = "".join(f"\r{i:5d}%" for i in range(10_000))
    assert c.feed(bar) == ""
    assert c.take_partial(0.5) == ""  # being redrawn: it waits for the longer pause
    assert c.take_partial(2.0) == f"{STDERR_MARK} 9999%"


def test_a_line_broken_by_the_other_stream_ends_where_it_was_broken() -> None:
    out = LineCleaner(max_line_chars=4)
    assert out.feed("123456") == "123456"
    assert out.line_open
    assert out.break_line() == "\n"  # nothing held, but the line was open: it ends here
    assert out.feed("78") == "" and out.break_line() == "78\n"
    assert out.break_line() == ""


def test_the_drop_marker_names_its_cause() -> None:
    b = OutputBatcher(max_batch_chars=100, flush_interval_s=1, max_pending_bytes=4)
    b.feed("abcdef", 0, drop_cause=DROPPED_BACKLOG)
    assert b.take() == dropped_marker(2, DROPPED_BACKLOG)
    assert "unreachable" not in dropped_marker(2, DROPPED_BACKLOG)
    assert b.take() == "cdef"
    b.feed("123456", 0, drop_cause=DROPPED_UNREACHABLE)
    b.feed("78", 0, drop_cause=DROPPED_BACKLOG)
    assert b.take() == dropped_marker(4, f"{DROPPED_UNREACHABLE} and {DROPPED_BACKLOG}")
    assert b.take() == "5678"


def test_yes_no_prompts() -> None:
    yn = [[{"text": "Yes", "data": "y"}, {"text": "No", "data": "n"}]]
    assert yes_no_buttons("Remove all files? [y/N] ") == yn
    assert yes_no_buttons("output\nContinue [Y/n]?") == yn
    assert yes_no_buttons("Proceed (y/n): ") == yn
    assert yes_no_buttons("Are you sure (yes/no)?") == [[{"text": "Yes", "data": "yes"}, {"text": "No", "data": "no"}]]
    assert yes_no_buttons("Continue? [y/N]\nok, continuing") is None  # answered already
    assert yes_no_buttons("[y/N] is the default") is None
    assert yes_no_buttons("no prompt here") is None


def test_child_environment_has_no_secrets() -> None:
    env = child_environment({"PATH": "/bin", "TOPICBUS_BUS_SECRET": "s", "TOPICBUS_BOT_TOKEN": "t",
                             "TOPICBUS_LEADER_URL": "ws://x", "HOME": "/h"}, pty=False)
    assert env == {"PATH": "/bin", "TOPICBUS_LEADER_URL": "ws://x", "HOME": "/h"}
    assert child_environment({"TERM": "dumb"}, pty=True)["TERM"] == "xterm-256color"


def test_follow_forgets_its_secrets_once_read() -> None:
    environ = {"PATH": "/bin", "TOPICBUS_BUS_SECRET": "s", "TOPICBUS_BOT_TOKEN": "t", "TOPICBUS_LEADER_URL": "ws://x"}
    assert sorted(forget_secret_environment(environ)) == ["TOPICBUS_BOT_TOKEN", "TOPICBUS_BUS_SECRET"]
    assert environ == {"PATH": "/bin", "TOPICBUS_LEADER_URL": "ws://x"}


# ---- pty mode (pyte) ----------------------------------------------------------------------------


def test_screen_lines_prompt_and_echo() -> None:
    r = ScreenRenderer(80, 24, quiet_s=0.25)
    assert r.feed(b"Python 3\r\n>>> ", 0) == "Python 3\n"
    assert r.take_partial(0.1, 0.1) == ""
    assert r.take_partial(0.3, 0.3) == ">>>"
    r.expect_echo("print(1)")
    out = r.feed(b"print(1)\r\n1\r\n>>> ", 1)
    assert out == "\n1\n"  # the echo of our own input is not posted; the prompt's line ends
    assert r.take_partial(0.3, 1.3) == ">>>"


def test_screen_colours_progress_and_spinners_become_plain_text() -> None:
    r = ScreenRenderer(80, 24, quiet_s=0.25, redraw_quiet_s=2.0)
    out = r.feed(b"\x1b[1;32mREADY\x1b[0m\r\n", 0)
    for i in range(11):
        out += r.feed(b"\r[" + b"#" * i + b" " * (10 - i) + b"] %d%%" % (i * 10), 0.1 * i)
    assert r.take_partial(0.5, 1.5) == ""  # redrawn: not posted while it may still move
    out += r.feed(b"\r\nwork |\x08/\x08-\x08\\\x08done\r\n", 1.6)
    assert out == "READY\n[##########] 100%\nwork done\n"
    assert "\x1b" not in out


def test_screen_rows_scrolled_off_are_posted_once() -> None:
    r = ScreenRenderer(40, 5)
    out = r.feed(b"".join(b"line %d\r\n" % i for i in range(50)), 0)
    assert out.splitlines() == [f"line {i}" for i in range(50)]
    assert r.feed(b"line 50\r\n", 1) == "line 50\n"


def test_redraws_over_posted_rows_become_snapshots_at_most_every_interval() -> None:
    r = ScreenRenderer(20, 4, quiet_s=0.25, snapshot_interval_s=3.0)
    assert r.feed(b"$ top\r\n", 0) == "$ top\n"
    assert r.feed(b"\x1b[Hload 1\r\ntasks 5", 1) == ""
    assert r.screen_mode
    assert r.take_partial(0.1, 1.1) == ""  # still drawing
    assert r.take_partial(0.3, 1.3) == "load 1\ntasks 5\n"
    assert r.feed(b"\x1b[Hload 2", 2) == ""
    assert r.take_partial(1.0, 3.0) == ""  # less than 3 s since the last snapshot
    assert r.next_due(2.0) == 4.3
    assert r.take_partial(1.0, 4.3) == "load 2\ntasks 5\n"


def test_echo_typed_ahead_and_echoed_twice_is_not_posted_but_equal_output_is() -> None:
    r = ScreenRenderer(80, 24)
    r.feed(b">>> ", 0)
    assert r.take_partial(1, 1) == ">>>"
    r.expect_echo("def f(x):\n    return x\n\n")  # --end-blocks: an empty line ends the block
    r.expect_echo("f(1)")
    r.expect_echo("2")
    # the terminal echoes "f(1)" at once (typed ahead), readline echoes it again with its prompt
    out = r.feed(b"def f(x):\r\n...     return x\r\nf(1)\r\n... \r\n>>> f(1)\r\n1\r\n>>> 2\r\n2\r\n>>> ", 2)
    assert out == "\n1\n2\n"
    assert r.take_partial(1, 3) == ">>>"
    r.expect_echo("ls\n")
    assert r.feed(b"ls\r\ntools\r\n", 4) == "\ntools\n"  # an output row ending like an input is kept


def test_an_answer_is_not_taken_for_the_echo_of_what_was_typed() -> None:
    r = ScreenRenderer(80, 24)
    r.feed(b"Delete everything? [y/N] ", 0)
    assert r.take_partial(1, 1) == "Delete everything? [y/N]"
    r.expect_echo("y\n")
    assert r.feed(b"y\r\nyou said y\r\n", 2) == "\nyou said y\n"
    r.expect_echo("q1\n")
    assert r.feed(b"q1\r\nanswer:q1\r\n", 3) == "answer:q1\n"  # the terminal's echo goes, the answer stays


def test_rows_the_terminal_wrapped_are_joined_into_their_line() -> None:
    r = ScreenRenderer(20, 5)
    line = "".join(f"w{n:02d} " for n in range(12)).rstrip()  # 47 characters: three rows of 20
    out = r.feed(line.encode() + b"\r\nshort\r\n", 0)
    assert out == line + "\nshort\n"
    exact = "x" * 20  # exactly the width, then a newline: no wrap, nothing joined
    assert r.feed(exact.encode() + b"\r\n" + b"y\r\n", 1) == exact + "\ny\n"


def test_a_wrapped_line_scrolling_off_the_top_is_kept_whole() -> None:
    r = ScreenRenderer(10, 3)
    line = "abcdefghij" * 5  # five rows on a three-row screen
    assert r.feed(line.encode(), 0) == ""
    assert r.feed(b"\r\n", 1) == line + "\n"


def test_a_long_echo_wrapped_by_the_terminal_is_not_posted() -> None:
    r = ScreenRenderer(30, 5)
    r.feed(b"bash-5.2# ", 0)
    assert r.take_partial(1, 1) == "bash-5.2#"
    command = "echo " + "x" * 60
    r.expect_echo(command + "\n", 1)
    out = r.feed(command.encode() + b"\r\n" + b"x" * 60 + b"\r\nbash-5.2# ", 2)
    assert out == "\n" + "x" * 60 + "\n"  # the prompt's line ends, the answer whole, no fragment of the command


def test_a_line_being_redrawn_is_taken_as_progress_and_its_final_state_posted() -> None:
    r = ScreenRenderer(80, 24, progress_first_s=1.0, progress_interval_s=2.0)
    r.live_progress = True
    assert r.feed(b"start\r\n\rget [  ] 0%", 0) == "start\n"
    assert r.take_partial(0.5, 0.5) == ""  # not a prompt: never a partial while shown as progress
    assert r.take_progress(0.5) == ""  # not yet
    r.feed(b"\rget [# ] 50%", 0.9)
    assert r.progress_due(0.9) == 1.0
    assert r.take_progress(1.0) == "get [# ] 50%"
    assert r.take_progress(1.5) == ""  # unchanged
    r.feed(b"\rget [##] 90%", 1.6)
    assert r.take_progress(2.0) == ""  # at most every 2 s
    assert r.take_progress(3.0) == "get [##] 90%"
    assert r.feed(b"\rget [##] 100%\r\nDone\r\n", 3.5) == "get [##] 100%\nDone\n"


def test_a_prompt_is_still_posted_as_a_partial_under_live_progress() -> None:
    r = ScreenRenderer(80, 24)
    r.live_progress = True
    r.feed(b"Deploy v1.4.2? [y/N] ", 0)
    assert r.take_partial(0.3, 0.3) == "Deploy v1.4.2? [y/N]"
    assert r.take_progress(5) == ""
    r.feed(b"\r\nOverwrite? (y/n)", 6)  # no space after it: still a prompt, so it gets its buttons
    assert r.take_partial(0.3, 6.3) == "Overwrite? (y/n)"


def test_a_pagers_prompt_erased_and_written_over_does_not_eat_the_next_line() -> None:
    r = ScreenRenderer(80, 24)
    r.feed(b"commit 1\r\n:", 0)
    assert r.take_partial(1, 1) == ":"
    assert r.feed(b"\r\x1b[Kroot@vm:~# ", 2) == ""
    assert r.take_partial(1, 3) == "root@vm:~#"  # whole: the ":" posted before is gone from the row


DASHBOARD_FRAME = b"\x1b[H\x1b[2JDASHBOARD header\r\ncounter %d\r\n\r\nfooter"


def test_an_alternate_screen_program_gives_whole_frames_and_the_normal_screen_comes_back() -> None:
    r = ScreenRenderer(30, 6, quiet_s=0.25)
    assert r.feed(b"$ dash\r\n", 0) == "$ dash\n"
    assert r.feed(b"\x1b[?1049h" + DASHBOARD_FRAME % 1, 1) == ""  # nothing line by line
    assert r.take_frame(0.05, 1.05) is None  # still drawing
    assert r.take_partial(1.0, 2.0) == ""  # and no snapshot either
    assert r.take_frame(0.2, 1.2) == "DASHBOARD header\ncounter 1\n\nfooter"  # header included
    assert r.feed(DASHBOARD_FRAME % 1, 1.5) == ""
    assert r.take_frame(1.0, 2.5) is None  # the same frame again: nothing to send
    assert r.feed(DASHBOARD_FRAME % 2, 2.6) == ""
    assert r.next_due(2.6) == 2.6 + 0.15
    assert r.take_frame(0.2, 2.8) == "DASHBOARD header\ncounter 2\n\nfooter"
    assert r.feed(DASHBOARD_FRAME % 3, 2.9) == ""
    assert r.take_frame(0.2, 3.1) is None  # at most one frame a second
    assert r.take_frame(0.9, 3.8) == "DASHBOARD header\ncounter 3\n\nfooter"
    # The program draws its last frame and leaves the alternate screen at once: that frame is final.
    assert r.feed(DASHBOARD_FRAME % 4 + b"\x1b[?1049l", 4.0) == ""
    assert r.take_frame(0.0, 4.0) == "DASHBOARD header\ncounter 4\n\nfooter"
    assert r.take_frame(1.0, 5.0) is None
    assert r.feed(b"$ ", 5.0) == ""  # the normal screen as it was: the prompt on the row after "$ dash"
    assert r.take_partial(1.0, 6.0) == "$"
    assert r.feed(b"ls\r\nfile\r\n", 6.0) == "ls\nfile\n"


def test_a_synchronized_update_is_never_torn_and_its_end_is_a_frame() -> None:
    r = ScreenRenderer(30, 4, quiet_s=0.25)
    r.feed(b"\x1b[?1049h\x1b[?2026h" + DASHBOARD_FRAME % 1, 0)
    assert r.take_frame(5.0, 5.0) is None  # quiet, but inside the update
    r.feed(b"\x1b[?2026l", 5.1)
    assert r.take_frame(0.0, 5.1) == "DASHBOARD header\ncounter 1\n\nfooter"


def test_a_cleared_screen_redrawn_is_a_session_until_it_scrolls() -> None:
    r = ScreenRenderer(30, 4, quiet_s=0.25)
    r.feed(DASHBOARD_FRAME % 1, 0)
    assert r.take_frame(0.2, 0.2) == "DASHBOARD header\ncounter 1\n\nfooter"
    r.feed(DASHBOARD_FRAME % 2, 1.0)
    assert r.take_frame(0.2, 1.2) == "DASHBOARD header\ncounter 2\n\nfooter"
    # Lines again: the screen scrolls; the session ends with the screen before the scroll.
    assert r.feed(b"\x1b[2J\x1b[Hdone\r\n", 2.0) == ""
    assert r.feed(b"a\r\nb\r\nc\r\nd\r\n", 2.1) == "d\n"
    assert r.take_frame(0.0, 2.1) == "done\na\nb\nc"
    assert r.feed(b"e\r\n", 3.0) == "e\n"
