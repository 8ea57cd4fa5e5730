"""Adapters for voice-agent frameworks (optional extras, from the talkloop
folder: ``pip install -e '.[livekit]'``, ``pip install -e '.[pipecat]'``)."""
