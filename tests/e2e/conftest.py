from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster
from tests.fakebotapi import FakeBotApi


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with FakeBotApi() as fake:
        c = Cluster(fake=fake, tmp=tmp_path)
        try:
            yield c
        finally:
            await c.shutdown()
