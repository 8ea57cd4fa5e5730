"""Realtime avatar calls: WebRTC peer (aiortc), signaling server (websockets), calls."""
