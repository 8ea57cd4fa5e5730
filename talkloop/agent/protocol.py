"""The websocket agent protocol: an agent in another process drives an avatar session's speech.

The agent connects to ``/ws?token=<session token>&role=agent``. The table is in
``docs/agents.md``. Agent -> server:

| message                                       | effect                                           |
|-----------------------------------------------|--------------------------------------------------|
| `{"type":"audio_format","sample_rate":R,"channels":C}` | declares the PCM of binary messages     |
| binary message                                | PCM16 LE audio of the current segment            |
| `{"type":"response.output_audio.delta","delta":b64}` | OpenAI Realtime audio (24 kHz mono by      |
|   (also `response.audio.delta`)               |   default; `item_id` labels the segment)         |
| `{"type":"segment_end"}` (also `response.output_audio.done`, `response.audio.done`) | end  |
| `{"type":"interrupt"}` (also `clear_buffer`)  | drop all unplayed speech; finished events follow |
| `{"type":"prompt","text":...}`                | new style prompt                                 |
| `{"type":"say","text":...}`                   | speak text with the built-in TTS                 |
| `{"type":"bye"}`                              | detach (the session and its viewer go on)        |

Server -> agent: `agent` (hello), `playback_started`, `playback_finished`, `error`.

A bad message is answered with an ``error`` naming the problem and the fix; the connection, the
session and the server go on. Audio beyond the session's queue limit is refused with ``busy``
(once per segment) and dropped: pace sending to at most that far ahead of playback.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from talkloop.agent.frames import AudioFormatError, AudioFrame, PlaybackEvent, PlaybackStarted
from talkloop.agent.session import AvatarSession
from talkloop.agent.text import TextError, check_text
from talkloop.pipeline.core.errors import BusyError, InputError

OPENAI_RATE = 24000  # OpenAI Realtime audio/pcm is always 24 kHz mono
DELTA_TYPES = ("response.output_audio.delta", "response.audio.delta")
DONE_TYPES = ("segment_end", "response.output_audio.done", "response.audio.done")
AGENT_TYPES = (
    "audio_format",
    "audio",
    *DELTA_TYPES,
    *DONE_TYPES,
    "interrupt",
    "clear_buffer",
    "prompt",
    "say",
    "bye",
)


class ProtocolError(InputError):
    """A message the server cannot act on; answered with an error, the session goes on."""

    session_fatal = False

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def decode_message(raw: str, types: tuple[str, ...]) -> dict[str, Any]:
    """JSON text -> a message dict whose ``type`` is one of ``types``; ProtocolError otherwise.

    Shared by the page protocol (talkloop/rtc/protocol.py) and the agent protocol.
    """
    try:
        msg = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ProtocolError(
            "bad_json", f"message is not valid JSON: {err.msg} at position {err.pos}"
        ) from None
    except RecursionError:  # "[[[[..." deeper than the parser's stack: not a message of ours
        raise ProtocolError("bad_json", "message is nested too deeply to be read") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("bad_message", 'a message must be a JSON object with a string "type"')
    if msg["type"] not in types:
        raise ProtocolError(
            "unknown_type",
            f"unknown message type {msg['type'][:60]!r} (expected one of: {', '.join(types)})",
        )
    return msg


def error(code: str, message: str) -> str:
    return json.dumps({"type": "error", "code": code, "message": message})


def event_message(event: PlaybackEvent) -> dict[str, Any]:
    """A playback event as the JSON the agent receives."""
    if isinstance(event, PlaybackStarted):
        msg: dict[str, Any] = {"type": "playback_started", "segment_id": event.segment_id}
    else:
        msg = {
            "type": "playback_finished",
            "segment_id": event.segment_id,
            "position_s": round(event.position_s, 4),
            "position_ms": event.position_ms,
            "interrupted": event.interrupted,
        }
    if event.label is not None:
        msg["item_id"] = event.label
    return msg


class AgentChannel:
    """Applies one agent connection's messages to a session.

    Args:
        avatar: the session the agent drives.
        source: this connection's segment source (segments of different sources never mix).
    """

    def __init__(self, avatar: AvatarSession, source: str = "agent") -> None:
        self.avatar = avatar
        self.source = source
        self.rate: int | None = None  # declared by audio_format, for binary messages
        self.channels = 1
        self.label: str | None = None
        self.closed = False
        self._busy_reported = False

    def handle(self, raw: str | bytes) -> None:
        """Act on one message. Raises ProtocolError naming what is wrong."""
        if isinstance(raw, bytes):
            if self.rate is None:
                raise ProtocolError(
                    "no_audio_format",
                    "binary audio before audio_format: first send "
                    '{"type":"audio_format","sample_rate":24000,"channels":1}',
                )
            self._audio(AudioFrame(bytes(raw), self.rate, self.channels))
            return
        msg = decode_message(raw, AGENT_TYPES)
        kind = msg["type"]
        if kind == "audio_format":
            rate, channels = msg.get("sample_rate"), msg.get("channels", 1)
            fmt = msg.get("format", "pcm_s16le")
            if fmt != "pcm_s16le":
                raise ProtocolError(
                    "bad_audio_format", f"format {fmt!r} is not supported; send pcm_s16le"
                )
            try:
                AudioFrame(b"", rate, channels).check()
            except AudioFormatError as err:
                raise ProtocolError("bad_audio_format", f"audio_format: {err}") from None
            self.rate, self.channels = rate, channels
        elif kind == "audio" or kind in DELTA_TYPES:
            field = "audio" if kind == "audio" else "delta"
            data = self._b64(msg, field)
            rate = msg.get("sample_rate", self.rate if kind == "audio" else OPENAI_RATE)
            if rate is None:
                raise ProtocolError(
                    "no_audio_format",
                    'audio without a rate: add "sample_rate" or send audio_format first',
                )
            item = msg.get("item_id")
            if isinstance(item, str) and item:
                self.label = item[:200]
            self._audio(AudioFrame(data, rate, msg.get("channels", self.channels)))
        elif kind in DONE_TYPES:
            self.avatar.end_of_segment(self.source)
            self.label, self._busy_reported = None, False
        elif kind in ("interrupt", "clear_buffer"):
            self.avatar.clear_buffer()
            self.label, self._busy_reported = None, False
        elif kind == "prompt":
            self.avatar.set_prompt(self._text(msg, allow_empty=True))
        elif kind == "say":
            self.avatar.say(self._text(msg))
        elif kind == "bye":
            self.closed = True

    def detach(self) -> None:
        """The agent left: its open segment ends normally (what was sent still plays)."""
        self.avatar.end_of_segment(self.source)

    # -- internals ---------------------------------------------------------------------------------

    def _audio(self, frame: AudioFrame) -> None:
        if self._busy_reported:
            # The segment already lost audio: dropping the rest keeps what plays a clean prefix
            # of the utterance (no holes), and a flood does not become a flood of errors.
            return
        try:
            self.avatar.push_audio(frame, self.label, self.source)
        except AudioFormatError as err:
            raise ProtocolError("bad_audio", str(err)) from None
        except BusyError as err:
            self._busy_reported = True
            raise ProtocolError(
                "busy", f"{err}; the rest of this segment is dropped until segment_end"
            ) from None

    @staticmethod
    def _b64(msg: dict[str, Any], field: str) -> bytes:
        value = msg.get(field)
        if not isinstance(value, str):
            raise ProtocolError("bad_message", f"{msg['type']}: field {field!r} must be base64")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError(
                "bad_audio", f"{msg['type']}: field {field!r} is not valid base64"
            ) from None

    @staticmethod
    def _text(msg: dict[str, Any], allow_empty: bool = False) -> str:
        try:
            return check_text(msg.get("text"), f"{msg['type']}: field 'text'", allow_empty)
        except TextError as err:
            raise ProtocolError(err.code, str(err)) from None
