"""Joining a Ray cluster (or starting a local one) for batch renders and live calls.

``--cluster`` takes ``auto`` (the cluster this machine belongs to, else a new local one),
``ray://HOST:PORT`` (Ray Client) or ``HOST:PORT`` (the head's GCS address, as ``ray start``
prints it). A local instance binds to 127.0.0.1 only and starts no dashboard.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pipeline.core.errors import ConfigError

SLOT = "talkloop_slot"  # the custom resource: one live call per unit (talkloop worker --slots)
LOCAL_IP = "127.0.0.1"
# A local instance needs a small object store: rows pass paths, calls pass messages.
LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024


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
    """Whether ``address="auto"`` would find a cluster (RAY_ADDRESS or a ``ray start`` here)."""
    if os.environ.get("RAY_ADDRESS"):
        return True
    return Path("/tmp/ray/ray_current_cluster").is_file()


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
    ray = import_ray()
    if ray.is_initialized():
        return "the Ray instance this process already joined"
    if address == "auto" and not _running_cluster():
        address = None
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
