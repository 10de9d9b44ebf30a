"""``topicbus`` command line: ``leader``, ``follow`` and ``status``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from topicbus import __version__
from topicbus.settings import (ENV_PREFIX, ConfigurationError, Settings, load_settings, missing_env_file_hint,
                               missing_leader_variables)

EXIT_CONFIG = 2

DESCRIPTION = """\
topicbus — one Telegram bot, many live agent processes, one forum topic each.

Configuration comes from TOPICBUS_* environment variables (and ./.env when present);
see README.md and .env.example for the full list."""


FOLLOW_DESCRIPTION = """\
Start CMD as a child process and attach it to the leader as one follower (its own topic).

Each owner message is typed into CMD: its lines, then a newline. A file (a document, photo, voice
note, audio, video, each file of an album) is saved whole under .topicbus/inbox and typed as
"[<kind> <path>]", or as "[<kind> <name> failed]" / "[<kind> <name> too large]" when it was not
saved (names are cleaned: no control characters, line breaks or path separators). CMD's output
is posted to the topic, monospace, without colour codes, with carriage-return progress bars and backspace spinners shown in their final state; stderr lines
are marked with ⚠. Output that ends at a yes/no prompt ([y/N], [Y/n], (yes/no)) gets Yes/No
buttons; a press types the answer. A line longer than a message (4,096 characters) is posted in
pieces as it comes. While the leader is reachable nothing is dropped: when it holds as much of
CMD's output as it takes, CMD waits in its write, as on a slow terminal.

The bus secret stays here: CMD's environment holds no TOPICBUS_* secret, and follow makes itself
non-dumpable, so CMD (or any process of the same user) cannot read follow's environment or memory.
A secret file CMD's user can read, CMD can read: --secret-fd takes the secret from a descriptor a
supervisor opened instead.

In the topic: /interrupt (Ctrl-C), /kill (SIGTERM, then SIGKILL after 5 s), /eof (end of input),
/screen (with --pty: the screen as a picture), //text (types /text). Here: Ctrl-C goes to CMD; a
second Ctrl-C within 2 s stops CMD and follow.
CMD starts with SIGINT, SIGQUIT, SIGTSTP and SIGPIPE at their defaults, even when follow was started
with them ignored (nohup, a script), so /interrupt always interrupts. While the leader cannot be
reached, follow retries and warns once, then once a minute with a count.
When CMD exits, its output is handed over, "⏹ exited with code N" is posted, and follow exits
with CMD's code."""

FOLLOW_EPILOG = """\
exit codes: CMD's own (128+N if killed by signal N); 75 superseded by a newer follower of the same
workspace; 78 refused (wrong secret, incompatible protocol); 126/127 CMD not executable/not found;
2 invalid usage.

examples:
  topicbus follow --pty -- python3 -i        # a REPL; --end-blocks to close indented blocks
  topicbus follow --pty -- bash
  topicbus follow --name build -- make -k"""


def _pty_size(value: str) -> tuple[int, int]:
    columns, sep, rows = value.lower().partition("x")
    if not sep or not columns.isdigit() or not rows.isdigit() or not (20 <= int(columns) <= 500) \
            or not (5 <= int(rows) <= 200):
        raise argparse.ArgumentTypeError("expected COLSxROWS, e.g. 80x24 (20-500 columns, 5-200 rows)")
    return int(columns), int(rows)


def _descriptor(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError("expected a file descriptor number, e.g. 3")
    return int(value)


def _add_credentials(command: argparse.ArgumentParser, trusted_for: str) -> None:
    """The bus secret (a file or the environment preferred) and the CA to trust, for commands that talk to
    the leader."""
    command.add_argument("--secret-file", metavar="PATH",
                         help=f"read the bus secret from PATH (default: {ENV_PREFIX}BUS_SECRET)")
    command.add_argument("--secret-fd", metavar="N", type=_descriptor,
                         help="read the bus secret from the inherited file descriptor N (to its end), then close "
                              "it: from a supervisor, so that no file the agent's user can read holds it")
    command.add_argument("--secret", metavar="S", help="the bus secret itself; visible to every user in `ps`, "
                                                       "prefer --secret-file, --secret-fd or the environment")
    command.add_argument("--ca-file", metavar="PATH",
                         help=f"CA bundle or self-signed certificate to trust for {trusted_for} "
                              f"(default: {ENV_PREFIX}BUS_CA_FILE)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topicbus", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"topicbus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("leader", help="run the bot (leader) in the foreground; exits 0 on SIGTERM/SIGINT",
                   description="Run the leader: poll Telegram, host the bus, route messages. A second leader on "
                               "the same database waits as standby and takes over when the first one dies.")

    follow = sub.add_parser(
        "follow", help="run CMD as a follower: its topic's messages go to its stdin, its output to the topic",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=FOLLOW_DESCRIPTION, epilog=FOLLOW_EPILOG)
    follow.add_argument("--leader", metavar="URL", help=f"bus URL (default: {ENV_PREFIX}LEADER_URL)")
    _add_credentials(follow, "a wss:// leader")
    follow.add_argument("--cwd", metavar="DIR", help="workspace directory (default: the current directory); "
                                                     "also CMD's working directory")
    follow.add_argument("--name", metavar="NAME", help="display name; tells agents in one directory apart")
    follow.add_argument("--session", metavar="ID", help="session id; tells agents in one directory apart "
                                                        "(wins over --name for identity)")
    follow.add_argument("--pty", action="store_true",
                        help="run CMD on a pseudo-terminal, rendered as a screen would show it (REPLs, shells, "
                             "programs that buffer or draw progress bars)")
    follow.add_argument("--pty-size", metavar="COLSxROWS", default="160x25", type=_pty_size,
                        help="terminal size under --pty (default: 160x25; rows the terminal wraps are joined "
                             "back, so a line is cut only where the program printed a newline)")
    follow.add_argument("--stderr", choices=("topic", "merge", "inherit"), default="topic",
                        help="CMD's stderr: posted and marked with ⚠ (topic, the default), mixed into stdout "
                             "unmarked (merge), or left on this terminal (inherit). Not with --pty")
    follow.add_argument("--format", dest="text_format", choices=("pre", "plain", "markdown"), default="pre",
                        help="how output is shown: monospace (pre, the default), plain text or Markdown")
    follow.add_argument("--context", action="store_true",
                        help="also type what a message replied to ([reply to …] before it), owners' edits "
                             "([edit] <new text>) and the file line after a transcribed voice note ([voice <path>]); "
                             "off by default, since a shell or REPL would run those lines")
    follow.add_argument("--end-blocks", action="store_true",
                        help="type an empty line after each multi-line message and one-line compound statement "
                             "(ends a block in Python's REPL)")
    follow.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")

    status = sub.add_parser("status", help="print the leader's view (followers, bindings, cleanups, rotation)")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument("--url", metavar="URL", help="status URL (default: http://BUS_HOST:BUS_PORT/v1/status, "
                                                     "https:// with TOPICBUS_BUS_TLS_CERT)")
    _add_credentials(status, "https://")
    return parser


def _settings_or_exit(*, leader: bool = False) -> Settings:
    try:
        return load_settings()
    except ConfigurationError as exc:
        problems = list(exc.problems)
        if leader:  # report missing required variables in the same run as invalid ones
            named = {line.split(":", 1)[0] for line in problems}
            problems += [line for line in missing_leader_variables() if line.split(":", 1)[0] not in named]
        _config_exit(problems)
        raise  # unreachable


def _config_exit(problems: Sequence[str]) -> None:
    """Exit 2 with one line per problem. When a variable is missing (or still the example's) and
    there is no ``.env`` here, the heading says so and how to create one."""
    missing = any(": required" in line or "placeholder from .env.example" in line for line in problems)
    hint = missing_env_file_hint() if missing else None
    print(f"topicbus: invalid configuration ({hint}):" if hint else "topicbus: invalid configuration:",
          file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)


def _run_with_signals(main_coro_factory) -> int:
    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await main_coro_factory(stop)

    return asyncio.run(runner())


def cmd_leader() -> int:
    # PTB_TIMEDELTA's one home: python-telegram-bot then hands durations (RetryAfter.retry_after, a
    # voice note's duration) as timedelta, its next major version's only form, without a deprecation
    # warning per read. Set here, when the leader starts, it holds however the leader is started
    # (make run, Docker, pip), not on import, and not for `follow`, whose agents inherit its
    # environment. An operator's own value wins; the readers take either form (bot/gateway.py,
    # handlers/topic_messages.py).
    os.environ.setdefault("PTB_TIMEDELTA", "true")
    settings = _settings_or_exit(leader=True)
    problems = settings.leader_problems()
    if problems:
        _config_exit(problems)
    from topicbus.logsetup import configure_logging

    configure_logging(level=settings.log_level, json=settings.log_json, secrets=settings.secrets())
    from topicbus.leader.process import FatalLeaderError, LeaderProcess

    from topicbus.storage.db import DatabaseDamaged, StorageUnavailable, is_damage
    from topicbus.storage.migrate import MigrationError

    async def main(stop: asyncio.Event) -> int:
        try:
            return await LeaderProcess(settings).run(stop)
        except FatalLeaderError as exc:
            print(f"topicbus: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        except (StorageUnavailable, MigrationError) as exc:
            if is_damage(exc) or is_damage(exc.__cause__ or exc):
                print(f"topicbus: {DatabaseDamaged(settings.db_path)}", file=sys.stderr)
            else:
                print(f"topicbus: database {settings.db_path}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        except Exception as exc:
            if not is_damage(exc):
                raise
            print(f"topicbus: {DatabaseDamaged(settings.db_path)}", file=sys.stderr)  # found while running
            return EXIT_CONFIG

    return _run_with_signals(main)


MAX_SECRET_BYTES = 64 * 1024


def read_secret_fd(fd: int) -> str:
    """The bus secret read from the inherited descriptor ``fd`` to its end (surrounding whitespace
    removed), which is then closed (0, 1 and 2 are pointed at /dev/null instead), so that nothing
    started later inherits it. Exits 2 with a readable message when it cannot be read, is empty or
    longer than 64 KiB. The secret itself is never printed."""
    chunks: list[bytes] = []
    size = 0
    problem = None
    try:
        while (data := os.read(fd, MAX_SECRET_BYTES)) and size <= MAX_SECRET_BYTES:
            chunks.append(data)
            size += len(data)
    except OSError as exc:  # not open, or not for reading (then it is left as it is: stderr, say)
        problem = f"--secret-fd: cannot read descriptor {fd} ({exc.strerror or type(exc).__name__})"
    else:
        _close_descriptor(fd)
    if problem is None and size > MAX_SECRET_BYTES:
        problem = f"--secret-fd: descriptor {fd} holds more than {MAX_SECRET_BYTES // 1024} KiB"
    secret = ""
    try:
        secret = b"".join(chunks).decode("utf-8").strip() if problem is None else ""
    except UnicodeDecodeError:
        problem = f"--secret-fd: descriptor {fd} does not hold UTF-8 text"
    if problem is None and not secret:
        problem = f"--secret-fd: descriptor {fd} is empty"
    if problem is not None:
        _config_exit([problem])
    return secret


def _close_descriptor(fd: int) -> None:
    try:
        if fd <= 2:  # stdin, stdout, stderr stay open (on /dev/null), as everything expects
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd, inheritable=True)
            finally:
                os.close(null)
        else:
            os.close(fd)
    except OSError:
        pass


def read_secret_file(path: str) -> str:
    """The bus secret stored in the file ``path`` (surrounding whitespace removed); exits 2 with a
    readable message when it cannot be read or is empty. The secret itself is never printed."""
    try:
        with open(path, encoding="utf-8") as fh:
            secret = fh.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        _config_exit([f"--secret-file: cannot read {path} ({getattr(exc, 'strerror', None) or type(exc).__name__})"])
        raise  # unreachable
    if not secret:
        _config_exit([f"--secret-file: {path} is empty"])
    return secret


def cmd_follow(args: argparse.Namespace) -> int:
    from topicbus.follower.hardening import forget_secret_environment, make_undumpable

    # First, before any secret is read: from now on a process of the same user (the agent) can read
    # neither this process's environment nor its memory (docs/operations.md, "What the agent can see").
    make_undumpable()
    settings = _settings_or_exit()
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        _config_exit(["follow: a command is required: topicbus follow [OPTIONS] -- CMD [ARGS...]"])
    secret = _secret(args, settings, "follow")
    forget_secret_environment()  # read now; nothing started later inherits them
    if not secret:
        _config_exit([settings.placeholder_problem("bus_secret") if settings.is_placeholder("bus_secret")
                      else f"{ENV_PREFIX}BUS_SECRET: required (the leader's secret; or --secret-file, --secret-fd)"])
    leader_url = args.leader or settings.leader_url
    if not leader_url.startswith(("ws://", "wss://")):
        _config_exit(["--leader: must start with ws:// or wss://"])
    ca_file = _ca_file(args, settings)
    from topicbus.follower.follow import run_follow
    from topicbus.logsetup import configure_logging

    configure_logging(level=settings.log_level, json=settings.log_json, secrets=[secret, *settings.secrets()])
    return asyncio.run(run_follow(leader_url=leader_url, secret=secret, command=argv, cwd=args.cwd,
                                  name=args.name, session=args.session,
                                  heartbeat_interval_s=settings.heartbeat_interval_ms / 1000,
                                  stderr=args.stderr, pty=args.pty, pty_size=args.pty_size,
                                  text_format=args.text_format, end_blocks=args.end_blocks, context=args.context,
                                  ca_file=ca_file))


def _secret(args: argparse.Namespace, settings: Settings, command: str) -> str:
    """The bus secret: ``--secret-fd``, ``--secret-file`` or ``--secret`` (with a warning: argv is
    public), else TOPICBUS_BUS_SECRET; empty when there is none."""
    given = [name for name, value in (("--secret", args.secret), ("--secret-file", args.secret_file),
                                      ("--secret-fd", args.secret_fd)) if value is not None]
    if len(given) > 1:
        _config_exit([f"{command}: {' and '.join(given)} exclude each other"])
    if args.secret_fd is not None:
        return read_secret_fd(args.secret_fd)
    if args.secret:
        print("topicbus: warning: --secret is visible to every user of this machine (ps, /proc); "
              f"prefer --secret-file or {ENV_PREFIX}BUS_SECRET", file=sys.stderr)
        return str(args.secret)
    if args.secret_file:
        return read_secret_file(args.secret_file)
    return settings.bus_secret.get_secret_value() if settings.bus_secret else ""


def _ca_file(args: argparse.Namespace, settings: Settings) -> str | None:
    """``--ca-file``, else TOPICBUS_BUS_CA_FILE; checked now, so a bad path is one readable line."""
    path = args.ca_file or (str(settings.bus_ca_file) if settings.bus_ca_file else None)
    if path is None:
        return None
    from topicbus.follower.client import tls_client_context

    try:
        tls_client_context(path)
    except ValueError as exc:
        _config_exit([f"--ca-file: {exc}"])
    return path


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings_or_exit()
    secret = _secret(args, settings, "status")
    url = args.url or settings.status_url
    ca_file = _ca_file(args, settings)
    context = None
    if ca_file is not None:
        from topicbus.follower.client import tls_client_context

        context = tls_client_context(ca_file)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            snapshot = json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        print(f"topicbus: leader answered HTTP {exc.code} at {url}"
              + (f" (check {ENV_PREFIX}BUS_SECRET or --secret-file)" if exc.code == 401 else ""), file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"topicbus: no leader reachable at {url} ({getattr(exc, 'reason', exc)})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(snapshot, indent=2, sort_keys=True))
    else:
        from topicbus.core.board import render_text
        from topicbus.status_json import status_report

        print(render_text(status_report(snapshot)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "leader":
        return cmd_leader()
    if args.command == "follow":
        return cmd_follow(args)
    if args.command == "status":
        return cmd_status(args)
    parser.print_help()
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
