"""The websocket agent protocol without WebRTC: an agent joins a session by token, streams audio
(binary PCM and OpenAI Realtime deltas), gets playback events; bad input never ends anything."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from talkloop.rtc.call import CallConfig

from support import drain, run, tone_pcm16, until, with_server

pytestmark = pytest.mark.unit


def test_agent_protocol_events_and_bad_input(live_pipeline) -> None:
    async def body(server, url, port):
        async with websockets.connect(url) as viewer:
            token = json.loads(await viewer.recv())["token"]
            avatar = server.calls[token].call.avatar
            avatar.start()  # as after the viewer's offer
            # the viewer's tracks stand-in: playback is what the outputs emit
            viewer_media = asyncio.create_task(drain(avatar))
            async with websockets.connect(url + f"?token={token}") as nope:
                not_agent = json.loads(await nope.recv())
            async with websockets.connect(url + f"?token={token}&role=agent") as agent:
                hello = json.loads(await agent.recv())
                async with websockets.connect(url + f"?token={token}&role=agent") as dup:
                    second = json.loads(await dup.recv())
                errors = []
                for raw in [
                    b"\x00\x00" * 100,  # binary before audio_format
                    json.dumps({"type": "audio_format", "sample_rate": 12345}),
                    json.dumps({"type": "audio_format"}),
                    json.dumps({"type": "dance"}),
                    "{oops",
                    json.dumps({"type": "response.output_audio.delta", "delta": "@@@"}),
                    json.dumps(
                        {
                            "type": "response.output_audio.delta",
                            "delta": base64.b64encode(b"\x01\x02\x03").decode(),
                        }
                    ),
                ]:
                    await agent.send(raw)
                    errors.append(await until(agent, "error"))
                # OpenAI Realtime deltas (24 kHz by default), labelled with their item
                pcm = tone_pcm16(12000, 24000, hz=220, amp=0.3).tobytes()
                for i in range(0, len(pcm), 4800):
                    delta = base64.b64encode(pcm[i : i + 4800]).decode()
                    await agent.send(
                        json.dumps(
                            {
                                "type": "response.output_audio.delta",
                                "delta": delta,
                                "item_id": "item_A",
                            }
                        )
                    )
                await agent.send(json.dumps({"type": "response.output_audio.done"}))
                started = await until(agent, "playback_started")
                done = await until(agent, "playback_finished")
                # binary PCM at a declared rate; a flood beyond the queue limit
                await agent.send(json.dumps({"type": "audio_format", "sample_rate": 16000}))
                flood = tone_pcm16(8000, 16000, hz=220, amp=0.3).tobytes()
                for _ in range(10):  # 5 s against a 2 s limit
                    await agent.send(flood)
                busy = await until(agent, "error")
                await agent.send(json.dumps({"type": "interrupt"}))
                cut = await until(agent, "playback_finished")
                await agent.send(json.dumps({"type": "prompt", "text": "calm"}))
                # an oversize message ends only the agent's connection
                await agent.send(b"\x00" * 400_000)
                with pytest.raises(ConnectionClosed):
                    await until(agent, "never")
            await asyncio.sleep(0.2)
            alive = token in server.calls
            async with websockets.connect(url + f"?token={token}&role=agent") as again:
                rejoined = json.loads(await again.recv())
            viewer_media.cancel()
        return not_agent, hello, second, errors, started, done, busy, cut, alive, rejoined

    live = CallConfig(playout_delay_ms=200, max_pending_speech_s=2.0)
    not_agent, hello, second, errors, started, done, busy, cut, alive, rejoined = run(
        with_server(live_pipeline, body, call_config=live), 120
    )
    assert not_agent["code"] == "not_supported"
    assert hello["type"] == "agent" and hello["sample_rate"] == 16000
    assert hello["output_sample_rate"] == 48000  # the avatar's audio leaves at full band
    assert second["code"] == "bad_state"
    assert [e["code"] for e in errors] == [
        "no_audio_format",
        "bad_audio_format",
        "bad_audio_format",
        "unknown_type",
        "bad_json",
        "bad_audio",
        "bad_audio",
    ]
    assert "audio_format" in errors[0]["message"] and "whole number" in errors[6]["message"]
    assert started["item_id"] == "item_A" and done["item_id"] == "item_A"
    assert done["interrupted"] is False and done["position_ms"] == 500
    assert busy["code"] == "busy" and "dropped" in busy["message"]
    assert cut["interrupted"] is True and cut["position_ms"] <= 2000
    assert alive and rejoined["type"] == "agent"  # the session and server outlived it all
