"""Adapters for voice-agent frameworks (optional extras: ``talkloop[livekit]``, ``talkloop[pipecat]``)."""
