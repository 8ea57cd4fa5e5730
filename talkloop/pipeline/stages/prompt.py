"""Prompt: the text prompt's embedding, at the start of a session and whenever the prompt changes."""

from __future__ import annotations

from talkloop.pipeline.core.stage import Stage, StageContext


class PromptStage(Stage):
    """Embed the text prompt; an empty prompt means "no text conditioning" (learned null)."""

    name = "prompt"
    reads = ("prompt",)
    writes = ("text_embedding",)
    needs = ("text_encoder",)

    def run(self, ctx: StageContext) -> None:
        prompt: str = ctx.read("prompt")
        if not prompt.strip():
            ctx.write("text_embedding", None)
            return
        emb = ctx.module("text_encoder").net.encode([prompt])  # (1, 384)
        ctx.write("text_embedding", emb.float())
