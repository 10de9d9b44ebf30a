from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakebotapi import FakeBotApi
from tests.integration.leader_env import LeaderEnv


@pytest.fixture
async def env(fake: FakeBotApi, tmp_path: Path) -> AsyncIterator[LeaderEnv]:
    leader = LeaderEnv(fake, tmp_path)
    try:
        yield leader
    finally:
        await leader.stop()
