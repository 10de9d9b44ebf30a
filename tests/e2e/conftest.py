"""End-to-end layer: leader and follower subprocesses (``tests/e2e/harness.py``) against the fake
Bot API. Fixtures: ``fake``, ``cluster`` (a ``Cluster`` over that fake and ``tmp_path``) and
``transcriber`` (a fake transcription endpoint)."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster
from tests.fakebotapi import FakeBotApi
from tests.support.fake_telegram import fake  # noqa: F401 - the fixture, shared with tests/integration
from tests.support.fake_transcriber import transcriber  # noqa: F401 - the fixture (voice notes as text)


@pytest.fixture
async def cluster(fake: FakeBotApi, tmp_path: Path) -> AsyncIterator[Cluster]:  # noqa: F811 - the fixture
    c = Cluster(fake=fake, tmp=tmp_path)
    try:
        yield c
    finally:
        await c.shutdown()
