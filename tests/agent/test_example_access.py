"""examples/agent.py against a server with an access token over wss with a self-signed
certificate: --access-token and --tls-ca get it in; without the token it is refused in one line."""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest
import websockets

from talkloop.rtc.call import CallConfig
from talkloop.rtc.security import AccessPolicy
from talkloop.rtc.tls import self_signed, server_context

from support import drain, run, with_server

pytestmark = pytest.mark.unit

TOKEN = "agents-need-this-token-too"


def test_access_token_and_ca_flags(example, tmp_path, capsys) -> None:
    cert, _ = self_signed(["localhost"], tmp_path)
    args = example.parse_args(
        [
            "--url",
            "wss://h:1/ws?token=ab&role=agent",
            "--access-token",
            TOKEN,
            "--tls-ca",
            str(cert),
        ]
    )
    assert args.url == f"wss://h:1/ws?token=ab&role=agent&access={TOKEN}"
    assert isinstance(args.ssl_context, ssl.SSLContext)
    for bad, message in [
        (["--tls-ca", str(cert)], "--tls-ca is for wss:// URLs"),
        (["--url", "wss://h:1/ws", "--tls-ca", str(tmp_path / "no.pem")], "--tls-ca: cannot use"),
    ]:
        with pytest.raises(SystemExit):
            example.parse_args(["--token", "ab", *bad])
        assert message in capsys.readouterr().err


def test_the_example_agent_speaks_over_wss_with_the_token(example, live_pipeline, tmp_path) -> None:
    cert, key = self_signed(["127.0.0.1"], tmp_path)
    client = ssl.create_default_context(cafile=str(cert))

    async def body(server, base, port):
        async with websockets.connect(f"{base}?access={TOKEN}", ssl=client) as viewer:
            token = json.loads(await viewer.recv())["token"]
            avatar = server.calls[token].call.avatar
            avatar.start()  # as after the viewer's offer
            media = asyncio.create_task(drain(avatar))  # the viewer's tracks stand-in
            with pytest.raises(SystemExit, match="bad_access"):
                await example.run(example.agent_url(base, token), ["Hi."], None, client)
            url = example.agent_url(base, token, TOKEN)
            await asyncio.wait_for(example.run(url, ["Hi."], None, client), 60)
            media.cancel()

    served = with_server(
        live_pipeline,
        body,
        ssl_context=server_context(cert, key),
        call_config=CallConfig(playout_delay_ms=200),
        access=AccessPolicy(token=TOKEN),
    )
    run(served, 120)
