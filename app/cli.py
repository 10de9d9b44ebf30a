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

# python-telegram-bot reports durations (RetryAfter.retry_after) as timedelta with this set.
os.environ.setdefault("PTB_TIMEDELTA", "true")

DESCRIPTION = """\
topicbus — one Telegram bot, many live agent processes, one forum topic each.

Configuration comes from TOPICBUS_* environment variables (and ./.env when present);
see README.md and .env.example for the full list."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topicbus", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"topicbus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("leader", help="run the bot (leader) in the foreground; exits 0 on SIGTERM/SIGINT",
                   description="Run the leader: poll Telegram, host the bus, route messages. A second leader on "
                               "the same database waits as standby and takes over when the first one dies.")

    follow = sub.add_parser(
        "follow", help="run CMD as a follower: its topic's messages go to its stdin, its stdout to the topic",
        description="Start CMD as a child process and attach it to the leader as one follower. Each owner message "
                    "in its topic is written to CMD's stdin as one line (line breaks become spaces); CMD's stdout "
                    "is posted to the topic in batches. Exits with CMD's exit code.")
    follow.add_argument("--leader", metavar="URL", help=f"bus URL (default: {ENV_PREFIX}LEADER_URL)")
    follow.add_argument("--secret", metavar="S", help=f"bus secret (default: {ENV_PREFIX}BUS_SECRET)")
    follow.add_argument("--cwd", metavar="DIR", help="workspace directory (default: the current directory); "
                                                     "also CMD's working directory")
    follow.add_argument("--name", metavar="NAME", help="display name; tells agents in one directory apart")
    follow.add_argument("--session", metavar="ID", help="session id; tells agents in one directory apart "
                                                        "(wins over --name for identity)")
    follow.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")

    status = sub.add_parser("status", help="print the leader's view (followers, bindings, cleanups, rotation)")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument("--url", metavar="URL", help="status URL (default: http://BUS_HOST:BUS_PORT/v1/status)")
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
    settings = _settings_or_exit(leader=True)
    problems = settings.leader_problems()
    if problems:
        _config_exit(problems)
    from topicbus.logsetup import configure_logging

    configure_logging(level=settings.log_level, json=settings.log_json, secrets=settings.secrets())
    from topicbus.leader.process import FatalLeaderError, LeaderProcess

    from topicbus.storage.db import StorageUnavailable
    from topicbus.storage.migrate import MigrationError

    async def main(stop: asyncio.Event) -> int:
        try:
            return await LeaderProcess(settings).run(stop)
        except FatalLeaderError as exc:
            print(f"topicbus: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        except (StorageUnavailable, MigrationError) as exc:
            print(f"topicbus: database {settings.db_path}: {exc}", file=sys.stderr)
            return EXIT_CONFIG

    return _run_with_signals(main)


def cmd_follow(args: argparse.Namespace) -> int:
    settings = _settings_or_exit()
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        _config_exit(["follow: a command is required: topicbus follow [OPTIONS] -- CMD [ARGS...]"])
    secret = args.secret or (settings.bus_secret.get_secret_value() if settings.bus_secret else "")
    if not secret:
        _config_exit([settings.placeholder_problem("bus_secret") if settings.is_placeholder("bus_secret")
                      else f"{ENV_PREFIX}BUS_SECRET: required (the leader's secret; or --secret)"])
    leader_url = args.leader or settings.leader_url
    if not leader_url.startswith(("ws://", "wss://")):
        _config_exit(["--leader: must start with ws:// or wss://"])
    from topicbus.follower.follow import run_follow
    from topicbus.logsetup import configure_logging

    configure_logging(level=settings.log_level, json=settings.log_json, secrets=[secret, *settings.secrets()])
    return asyncio.run(run_follow(leader_url=leader_url, secret=secret, command=argv, cwd=args.cwd,
                                  name=args.name, session=args.session,
                                  heartbeat_interval_s=settings.heartbeat_interval_ms / 1000))


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings_or_exit()
    secret = settings.bus_secret.get_secret_value() if settings.bus_secret else ""
    url = args.url or settings.status_url
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            snapshot = json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        print(f"topicbus: leader answered HTTP {exc.code} at {url}"
              + (" (check TOPICBUS_BUS_SECRET)" if exc.code == 401 else ""), file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"topicbus: no leader reachable at {url} ({getattr(exc, 'reason', exc)})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(snapshot, indent=2, sort_keys=True))
    else:
        from topicbus.core.board import render_text

        print(render_text(snapshot))
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
