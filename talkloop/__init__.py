"""talkloop: streaming talking-avatar video, audio in and a lip-synced face out while it arrives.

The package holds three parts: :mod:`talkloop.pipeline` (the framework, the model families, the
outputs and the command line), :mod:`talkloop.rtc` (``talkloop serve``: the live server and its
page, ``talkloop/web``) and :mod:`talkloop.agent` (voice agents: ``AvatarSession``, the agent
protocol and the LiveKit and Pipecat adapters).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("talkloop")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
