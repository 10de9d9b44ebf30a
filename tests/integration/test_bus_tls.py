"""TLS on the bus (docs/operations.md, "TLS"): wss:// for followers, https:// for the HTTP endpoints, with a
certificate and key the leader loads; a follower trusts a self-signed certificate through its CA
file option, and one without it is refused by its own verification."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest

from topicbus.bus.server import BusServer, TlsConfigurationError, tls_context
from topicbus.follower.client import FollowerClient, tls_client_context
from tests.integration.leader_env import LeaderEnv
from tests.support.certs import self_signed

SECRET = "tls-secret-value"


async def test_a_follower_registers_over_wss_with_the_ca_file_and_https_serves_status(
        env: LeaderEnv, tmp_path: Path):
    cert, key = self_signed(tmp_path)
    services = await env.start()
    server = BusServer(host="127.0.0.1", port=0, secret=SECRET, status=lambda: services.status.snapshot(),
                       metrics=lambda: {}, ssl_context=tls_context(cert, key))
    await server.start()
    try:
        assert env.authority is not None
        server.publish(services.followers, env.authority.epoch)
        server.polling = True
        port = server.bound_port
        client = FollowerClient(leader_url=f"wss://127.0.0.1:{port}/v1/bus", secret=SECRET, cwd=str(tmp_path / "w"),
                                ca_file=cert)
        async with client:
            assignment = await client.wait_registered(timeout=20)
            assert assignment.thread_id

        trusted = tls_client_context(cert)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=trusted) as resp:
                assert resp.status == 200 and (await resp.json())["role"] == "leader"
            async with http.get(f"https://127.0.0.1:{port}/v1/status", ssl=trusted,
                                headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # no CA file: not trusted
                await http.ws_connect(f"wss://127.0.0.1:{port}/v1/bus",
                                      headers={"Authorization": f"Bearer {SECRET}"})
            with pytest.raises(aiohttp.ClientError):  # plain text on the TLS port
                async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    await resp.read()
    finally:
        await server.stop()


def test_unusable_certificate_files_are_reported_readably(tmp_path: Path):
    cert, key = self_signed(tmp_path)
    with pytest.raises(TlsConfigurationError, match="not found"):
        tls_context(tmp_path / "missing.crt", key)
    other_cert, _ = self_signed(tmp_path, name="other")
    with pytest.raises(TlsConfigurationError, match="cannot load"):
        tls_context(other_cert, key)  # a key that does not belong to the certificate
    assert isinstance(tls_context(cert, key), ssl.SSLContext)
    with pytest.raises(ValueError, match="cannot use the CA file"):
        tls_client_context(tmp_path / "missing.pem")
