"""The small error vocabulary of talkloop.

Every error says what is wrong and how to fix it. ``retryable`` tells a caller whether the same
call may succeed later (a busy server, a dropped network) or never will (bad input, bad config).
``session_fatal`` tells a server whether the error ends the session that raised it; no error ends
the server itself.
"""

from __future__ import annotations


class TalkloopError(Exception):
    """Base class: a problem talkloop can name."""

    retryable: bool = False
    session_fatal: bool = True


class ConfigError(TalkloopError):
    """A configuration value is invalid or two values contradict each other."""


class InputError(TalkloopError):
    """User input (an audio file, an image, a message) is unusable."""


class PipelineError(TalkloopError):
    """The stage graph is inconsistent: a stage reads what nobody writes, or needs a missing module."""


class CheckpointError(TalkloopError):
    """A checkpoint is missing, unreadable, or does not match its config."""


class WeightsMissingError(CheckpointError):
    """A model family was asked for trained weights that are not installed."""


class SessionClosedError(TalkloopError):
    """An operation was attempted on a session that has ended."""

    session_fatal = False


class BusyError(TalkloopError):
    """A capacity limit was reached (too many sessions, a full queue)."""

    retryable = True
    session_fatal = False
