"""Fixtures of the agent tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent.py"


@pytest.fixture(scope="module")
def example():
    """examples/agent.py (a script, not a module of the package), loaded afresh per test module."""
    spec = importlib.util.spec_from_file_location("talkloop_example_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
