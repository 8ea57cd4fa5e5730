"""Text a client gives the avatar (a line to say, a style prompt): one limit and one check.

The page's protocol (``talkloop/rtc/protocol.py``), the agent protocol (``talkloop/agent/protocol.py``) and the
built-in TTS (``talkloop/agent/tts.py``) all check text here, so they agree on what is too long.
"""

from __future__ import annotations

from talkloop.pipeline.core.errors import InputError

__all__ = ["MAX_TEXT_CHARS", "TextError", "check_text"]

# A line of speech or a prompt; 2,000 characters is about two minutes of speech, and bounds what
# one message can make espeak synthesise.
MAX_TEXT_CHARS = 2000


class TextError(InputError):
    """Text that cannot be used; ``code`` is the protocol's error code for it."""

    session_fatal = False

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_text(value: object, what: str = "text", allow_empty: bool = False) -> str:
    """``value``, unchanged, if it is usable text.

    Args:
        value: what the client sent.
        what: how the error names it (e.g. ``say: field 'text'``).
        allow_empty: accept an empty or blank string (a prompt may be cleared).

    Raises:
        TextError: ``bad_message`` when it is not a string or is blank, ``too_long`` when it is
            over ``MAX_TEXT_CHARS`` characters.
    """
    if not isinstance(value, str):
        raise TextError("bad_message", f"{what} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise TextError("bad_message", f"{what} is empty: there is nothing to say")
    if len(value) > MAX_TEXT_CHARS:
        raise TextError(
            "too_long",
            f"{what} is {len(value)} characters long; at most {MAX_TEXT_CHARS} are accepted",
        )
    return value
