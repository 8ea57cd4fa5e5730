"""Joining a Ray cluster (or starting a local one) for batch renders and live calls.

``--cluster`` takes ``auto`` (the cluster this machine belongs to, else a new local one),
``ray://HOST:PORT`` (Ray Client) or ``HOST:PORT`` (the head's GCS address, as ``ray start``
prints it). A local instance binds to 127.0.0.1 only and starts no dashboard.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError

SLOT = "talkloop_slot"  # the custom resource: one live call per unit (talkloop worker --slots)
CALL_NAMESPACE = "talkloop"  # the Ray namespace of call actors (named talkloop-call-<hex>)
LOCAL_IP = "127.0.0.1"
# A local instance needs a small object store: rows pass paths, calls pass messages.
LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024


def token_auth_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``RAY_AUTH_MODE=token`` where a token is at hand and no mode is set.

    Ray turns token authentication on for a head it starts (making ``~/.ray/auth_token`` if
    needed), but a node or driver that *joins* sends the token only in token mode; so with the
    token file (or ``RAY_AUTH_TOKEN``) present and no mode chosen, joining uses it
    (docs/scaling.md, Authentication). ``RAY_AUTH_MODE=disabled`` still opts out."""
    out = dict(env)
    token = Path(out.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if "RAY_AUTH_MODE" not in out and (out.get("RAY_AUTH_TOKEN") or token.is_file()):
        out["RAY_AUTH_MODE"] = "token"
    return out


def import_ray():
    """The ``ray`` module, or one ConfigError line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "Ray is not installed: pip install 'talkloop[cluster]' (or pip install ray) to use "
            "--cluster, render-batch or worker"
        ) from None
    return ray


def _running_cluster() -> bool:
    """Whether ``address="auto"`` would find a live cluster: RAY_ADDRESS, or the address a
    ``ray start`` on this machine left in /tmp/ray and whose GCS port answers (a stopped or
    killed cluster can leave the file behind)."""
    if os.environ.get("RAY_ADDRESS"):
        return True
    try:
        address = Path("/tmp/ray/ray_current_cluster").read_text().strip()
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def connect(address: str | None, *, slots: int = 0, num_cpus: int | None = None) -> str:
    """Connect this process to Ray; returns what it connected to (for the log line).

    Args:
        address: None or ``"local"``: start a local instance; ``"auto"``: the running cluster,
            else a local instance; ``ray://HOST:PORT`` or ``HOST:PORT``: that cluster.
        slots: live-call slots (``talkloop_slot``) of a local instance.
        num_cpus: CPUs of a local instance (default: all of this machine's).

    Raises:
        ConfigError: Ray is missing, or the cluster cannot be reached.
    """
    if address == "auto" and not _running_cluster():
        address = None
    if address not in (None, "local"):  # before Ray reads its configuration
        os.environ.update(token_auth_env(dict(os.environ)))
    ray = import_ray()
    if ray.is_initialized():
        return "the Ray instance this process already joined"
    try:
        if address in (None, "local"):
            ray.init(
                num_cpus=num_cpus,
                resources={SLOT: slots} if slots else None,
                include_dashboard=False,
                _node_ip_address=LOCAL_IP,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
            return "a local Ray instance"
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except ConnectionError as err:
        raise ConfigError(f"cannot join the Ray cluster at {address}: {err}") from None
    except ValueError as err:  # ray's own words for a malformed address
        raise ConfigError(f"--cluster {address}: {err}") from None
    return f"the Ray cluster at {address}"


def disconnect() -> None:
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()
