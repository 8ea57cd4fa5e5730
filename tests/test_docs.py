"""docs/architecture.md names what exists: every path it gives is in the tree, every dotted
``talkloop.`` name imports, and every family implements the contract it describes."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from talkloop.pipeline.models import registry
from talkloop.pipeline.models.spec import FamilySpec, specs

from support import resolve

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
CODE = re.findall(r"`([^`\s]+)`", DOC)
PATHS = sorted({c.rstrip("/") for c in CODE if c.startswith(("talkloop/", "tests/", "docs/"))})
NAMES = sorted({c for c in CODE if re.fullmatch(r"talkloop(\.\w+)+", c)})
CONTRACT = ("load_modules", "phases", "load_reference", "installed_weights")


def test_the_doc_names_paths_and_dotted_names() -> None:
    assert len(PATHS) > 20 and len(NAMES) >= 3  # the patterns still find the doc's names


@pytest.mark.parametrize("path", PATHS)
def test_every_path_exists(path: str) -> None:
    assert (ROOT / path).exists(), f"docs/architecture.md names {path}, which is not in the tree"


@pytest.mark.parametrize("name", NAMES)
def test_every_dotted_name_imports(name: str) -> None:
    resolve(name)


@pytest.mark.parametrize("name", sorted(specs()))
def test_every_family_implements_the_contract(name: str) -> None:
    spec = specs()[name]
    assert isinstance(spec, FamilySpec) and spec.native_sizes
    module = registry.family(name)
    for function in CONTRACT:
        assert callable(getattr(module, function)), f"{name}'s family.py has no {function}"
        assert f"`{function}`" in DOC  # and the doc names it
    for command in (spec.trainer, spec.evaluator):
        if command is not None:
            module_name, _, attr = command.partition(":")
            assert callable(getattr(importlib.import_module(module_name), attr))
