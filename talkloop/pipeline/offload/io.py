"""Moving a network's inputs to the device and its outputs back, around its entry points.

On the CPU nothing moves. On a GPU the stages keep handing host tensors to the networks (they are
device-agnostic), so a forward pre-hook moves tensor arguments to the device and a forward hook
brings the result back. Networks driven through other methods (the VAE's ``encode``/``decode``,
the audio encoder's ``log_mel``/``normalise``) get those methods wrapped on the instance; the
class, and so the model code, is untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ENTRY_METHODS = ("encode", "encode_dist", "decode", "log_mel", "normalise", "init_norm_state")


def _tree(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple):
        return tuple(_tree(v, fn) for v in x)
    if isinstance(x, list):
        return [_tree(v, fn) for v in x]
    if isinstance(x, dict):
        return {k: _tree(v, fn) for k, v in x.items()}
    return x


def attach_io(net: nn.Module, device: torch.device) -> None:
    """Make ``net`` accept and return host tensors while it computes on ``device``."""
    if device.type == "cpu":
        return
    host = torch.device("cpu")

    def to_dev(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=True)

    def to_host(t: torch.Tensor) -> torch.Tensor:
        # Blocking on purpose: the host is about to read the result (the stage's next step or a
        # sink), and a non-blocking device-to-host copy could be read before it landed.
        return t.to(host)

    def pre(module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
        return _tree(args, to_dev), _tree(kwargs, to_dev)

    def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
        return _tree(output, to_host)

    net.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)
    net.register_forward_hook(post, with_kwargs=True)
    for name in ENTRY_METHODS:
        method = getattr(net, name, None)
        if method is None or not callable(method):
            continue

        def wrapped(*args: Any, _m: Callable = method, **kwargs: Any) -> Any:
            return _tree(_m(*_tree(args, to_dev), **_tree(kwargs, to_dev)), to_host)

        setattr(net, name, functools.wraps(method)(wrapped))
