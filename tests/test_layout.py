"""The package's layout holds: every import goes down the layers (or stays level), no module
imports itself back through another, and the module map of docs/development.md lists exactly the
modules there are."""

import ast
import re
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "charlm"

# Bottom to top. A module may import from its own layer or from below, never from above.
LAYERS = [
    {"errors", "logs", "files", "settings", "config", "config_rules", "config_inference", "config_tools", "lazy"},
    {"runtime"},
    {"cells", "corpora"},
    {"model", "sizing", "embedding", "regularisers", "checkpoint", "checkpoint_checks", "checkpoint_safetensors"},
    {"runs"},
    {"inference"},
    {"training", "tasks"},
    {"api", "api_scoring"},
    {"experiments", "tools", "serve"},
    {"cli", "__main__"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, name: str) -> set[str]:
    """Every charlm module ``path`` imports, at the top or inside a function."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("charlm"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if not base.startswith("charlm"):
                continue
            known = modules()
            for alias in node.names:  # `from charlm.runs import provenance` imports a module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found


def layer(name: str) -> int | None:
    wing = name.split(".")[1] if "." in name else None
    for index, members in enumerate(LAYERS):
        if wing in members:
            return index
    return None


def test_every_import_goes_down_the_layers():
    upward = []
    for name, path in modules().items():
        if name == "charlm":  # the package's front: lazy exports of the facade
            continue
        assert layer(name) is not None, f"{name} belongs to no layer: add its wing to LAYERS and docs/development.md"
        for imported in imports_of(path, name):
            if imported != "charlm" and layer(imported) > layer(name):
                upward.append(f"{name} -> {imported}")
    assert upward == []


def test_no_module_imports_itself_back():
    known = modules()
    graph = {name: {i for i in imports_of(path, name) if i in known and i != name} for name, path in known.items()}
    for name in graph:  # a package's __init__ imports its own modules; they may not import it back
        graph[name] = {i for i in graph[name] if not (name.startswith(i + ".") and known[i].name == "__init__.py")}
    cycles, state = [], {}

    def visit(name, trail):
        state[name] = "open"
        for nxt in sorted(graph[name]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(trail[trail.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_module_map_lists_every_module():
    page = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    block = re.search(r"```text\ncharlm/\n(.*?)```", page, re.S)
    assert block, "docs/development.md lost its module map (a ```text block starting with charlm/)"
    listed = re.findall(r"^\s+([\w/]+\.py|[\w/]+\.toml)\s", block.group(1), re.M)
    actual = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.parent == PACKAGE
    )
    assert sorted(set(listed)) == sorted(listed), "a module is listed twice"
    assert sorted(name for name in listed if name.endswith(".py")) == actual
