"""What `topicbus follow` makes of a child's output: pipe-mode cleaning, pty rendering (pyte), prompts."""

from __future__ import annotations

from topicbus.follower.child import child_environment
from topicbus.follower.output import STDERR_MARK, LineCleaner, render_line, strip_escapes, yes_no_buttons
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


def test_full_screen_redraws_become_snapshots_at_most_every_interval() -> None:
    r = ScreenRenderer(20, 4, quiet_s=0.25, snapshot_interval_s=3.0)
    assert r.feed(b"$ top\r\n", 0) == "$ top\n"
    assert r.feed(b"\x1b[H\x1b[2Jload 1\r\ntasks 5", 1) == ""
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
