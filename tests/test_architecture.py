"""docs/architecture.md cannot name code that does not exist, nor leave out the family contract.

The doc's conventions, which this test reads:

- Every span in backticks, outside fenced code blocks, that is a dotted name starting with
  ``talkloop.`` (``talkloop.pipeline.models.registry.build_pipeline``) names a module or an
  object: the longest prefix that imports as a module is imported, the rest is looked up with
  ``getattr``, one attribute after the other. A name whose module needs an optional extra that is
  not installed (LiveKit, Pipecat, Ray) is skipped, not failed.
- Every span in backticks that is a path of a Python file under ``talkloop/``
  (``talkloop/pipeline/core/session.py``) imports as the module it is.
- The section headed "The family contract" lists, one bullet each (a line that starts with
  ``- `name```), the module-level functions the framework calls on a family's ``family.py``:
  exactly the attributes the code reads off ``family(...)`` (``registry.family``), and every
  family implements each of them.
- The section headed "`FamilySpec`: ..." lists, one bullet each, exactly the fields of
  ``FamilySpec``.
- Every state field a session keeps (``SHARED_FIELDS`` and each family's ``state_fields``) is
  named in backticks.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from talkloop.pipeline.core.state import SHARED_FIELDS
from talkloop.pipeline.models import registry
from talkloop.pipeline.models.spec import FamilySpec, specs

from support import resolve

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PROSE = re.sub(r"^```.*?^```[ \t]*$", "", DOC, flags=re.M | re.S)  # fenced blocks left out
SPANS = re.findall(r"`([^`\s]+)`", PROSE)
NAMES = sorted({s for s in SPANS if re.fullmatch(r"talkloop(\.\w+)+", s)})
FILES = sorted({s for s in SPANS if re.fullmatch(r"talkloop(/\w+)+\.py", s)})


def section(heading: str) -> str:
    """The text under the first heading that starts with ``heading``, to the next heading."""
    match = re.search(rf"^#+ {re.escape(heading)}.*?$(.*?)(?=^#|\Z)", DOC, flags=re.M | re.S)
    assert match, f"docs/architecture.md has no section headed {heading!r}"
    return match.group(1)


def bullets(text: str) -> set[str]:
    """The names in backticks that open the bullets of ``text``."""
    return set(re.findall(r"^- `(\w+)`", text, flags=re.M))


def called_on_families() -> set[str]:
    """The attributes any module of talkloop reads off ``family(...)``/``registry.family(...)``."""
    found: set[str] = set()
    for path in (ROOT / "talkloop").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call):
                func = node.value.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name == "family":
                    found.add(node.attr)
    return found


CONTRACT = bullets(section("The family contract"))
SPEC_FIELDS = bullets(section("`FamilySpec`"))


def test_the_conventions_still_find_the_doc_s_names() -> None:
    assert len(NAMES) > 100 and len(FILES) > 10
    assert CONTRACT and SPEC_FIELDS


@pytest.mark.parametrize("name", NAMES)
def test_every_dotted_name_imports(name: str) -> None:
    resolve(name)


@pytest.mark.parametrize("path", FILES)
def test_every_python_file_imports(path: str) -> None:
    assert (ROOT / path).is_file(), f"docs/architecture.md names {path}, which is not a file"
    resolve(path.removesuffix(".py").replace("/", "."))


def test_the_contract_is_what_the_framework_calls() -> None:
    called = called_on_families()
    assert called, "found no family(...).X call: has the registry changed its way?"
    assert called == CONTRACT, (
        f"the doc's contract {sorted(CONTRACT)} is not what the code calls {sorted(called)}"
    )


@pytest.mark.parametrize("name", sorted(specs()))
def test_every_family_implements_the_contract(name: str) -> None:
    module = registry.family(name)
    for function in sorted(CONTRACT):
        assert callable(getattr(module, function, None)), f"{name}'s family.py has no {function}"


def test_the_spec_fields_are_the_dataclass_s() -> None:
    fields = {f.name for f in dataclasses.fields(FamilySpec)}
    assert fields == SPEC_FIELDS, (
        f"missing from the doc: {sorted(fields - SPEC_FIELDS)}; "
        f"not fields: {sorted(SPEC_FIELDS - fields)}"
    )


def test_every_state_field_is_named() -> None:
    kept = {f.name for f in SHARED_FIELDS}
    for spec in specs().values():
        kept |= {f.name for f in spec.state_fields}
    missing = sorted(f for f in kept if f"`{f}`" not in DOC)
    assert not missing, f"docs/architecture.md does not name the state fields {missing}"
