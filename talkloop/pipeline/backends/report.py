"""What runs where: the backend, dtype and int8 parts of a loaded pipeline, for bench and stats."""

from __future__ import annotations

from collections.abc import Mapping

from talkloop.pipeline.core.module import Module


def describe(modules: Mapping[str, Module], compute_dtype: str) -> dict:
    """``{"backend", "dtype", "int8"}``: the backend of the exported networks (``torch`` when
    none is), torch's compute dtype, and the networks that run in int8 (e.g. ``vae.decoder``)."""
    backend, int8 = "torch", []
    for name, module in modules.items():
        for sub_name, sub in module.net.named_modules():
            fwd = sub.__dict__.get("forward")
            if getattr(fwd, "backend", None) is None:
                continue
            backend = fwd.backend
            if str(getattr(fwd, "variant", "")).startswith("int8"):
                int8.append(f"{name}.{sub_name}" if sub_name else name)
    return {"backend": backend, "dtype": compute_dtype, "int8": sorted(int8)}
