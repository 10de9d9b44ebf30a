"""HTTP endpoints of the bus server (docs/operations.md, "HTTP endpoints"): /healthz by role, /metrics, /v1/status auth."""

from __future__ import annotations

import aiohttp

from topicbus.bus import metrics
from topicbus.bus.server import BusServer
from topicbus.core.status import StatusReport


async def test_healthz_reports_role_and_is_503_until_polling():
    server = BusServer(host="127.0.0.1", port=0, secret="secret-value", status=lambda: _status(),
                       metrics=lambda: {metrics.LEADER: 1})
    await server.start()
    base = f"http://127.0.0.1:{server.bound_port}"
    try:
        async with aiohttp.ClientSession() as http:
            async def health():
                async with http.get(f"{base}/healthz") as resp:
                    return resp.status, await resp.json()

            assert await health() == (200, {"role": "standby", "epoch": 0, "followers": 0})
            server.role, server.epoch = "starting", 4
            assert (await health())[0] == 503
            server.role = "leader"  # published but not yet polling
            assert (await health())[0] == 503
            server.polling = True
            assert await health() == (200, {"role": "leader", "epoch": 4, "followers": 0})
            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200 and "topicbus_leader 1.0\n" in await resp.text()
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            async with http.get(f"{base}/v1/status") as resp:
                assert resp.status == 401
            async with http.get(f"{base}/v1/status", headers={"Authorization": "Bearer secret-value"}) as resp:
                assert resp.status == 200 and (await resp.json())["role"] == "leader"
    finally:
        await server.stop()


async def _status() -> StatusReport:
    return StatusReport(role="leader", epoch=4)
