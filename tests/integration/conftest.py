"""Integration layer: real PTB and real SQLite in-process, against the fake Bot API.

Fixtures: ``fake`` (a fresh ``FakeBotApi``), ``env`` (a ``LeaderEnv`` over it and a database in
``tmp_path``) and ``store`` (a ``StoreEnv``: only the database, migrated, with the lease taken)."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakebotapi import FakeBotApi
from tests.integration.leader_env import LeaderEnv
from tests.integration.store_env import StoreEnv
from tests.support.fake_telegram import fake  # noqa: F401 - the fixture, shared with tests/e2e


@pytest.fixture
async def env(fake: FakeBotApi, tmp_path: Path) -> AsyncIterator[LeaderEnv]:  # noqa: F811 - the fixture
    leader = LeaderEnv(fake, tmp_path)
    try:
        yield leader
    finally:
        await leader.stop()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[StoreEnv]:
    opened = await StoreEnv.open(tmp_path)
    try:
        yield opened
    finally:
        await opened.db.close()
