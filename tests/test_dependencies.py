"""Every module replay_sim imports is declared in pyproject.toml: an install from the wheel can start.

A package that arrives in the dev venv only as another package's dependency (``sniffio`` came with
``openai``) works here and fails in a user's ``pip install``. This walks every import of the package
(in functions too) and maps it to the distribution that provides it in this venv; the slow
``tests/cli/test_wheel.py`` then proves an isolated install of the built wheel starts.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "replay_sim"
EXTRA_HOMES = {"ray": "scale"}
"""Optional dependencies (pip extras) and the only subpackage that may import them."""


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = {extra: {_name(r) for r in project["optional-dependencies"][extra]} for extra in EXTRA_HOMES}
    return {_name(r) for r in project["dependencies"]}, extras


def _imports(path: Path) -> set[str]:
    """The top-level names of the absolute imports of one module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__", "replay_sim"}


def test_every_module_the_package_imports_comes_from_a_declared_dependency() -> None:
    required, extras = _declared()
    providers = packages_distributions()
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        allowed = set(required)
        for extra, home in EXTRA_HOMES.items():
            if path.relative_to(PACKAGE).parts[0] == home:
                allowed |= extras[extra]
        for module in sorted(_imports(path)):
            dists = {_name(d) for d in providers.get(module, [])}
            if not dists:
                problems.append(f"{where}: imports {module!r}, which no installed distribution provides")
            elif not dists & allowed:
                problems.append(
                    f"{where}: imports {module!r} from {sorted(dists)}, not declared in pyproject.toml"
                )
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_module_only_another_package_brings() -> None:
    """The walk finds imports inside functions, and a module of an undeclared distribution fails it."""
    required, _ = _declared()
    tree = "def f():\n    import sniffio\n    from httpx2 import AsyncClient\n"
    found = {
        alias.name
        for node in ast.walk(ast.parse(tree))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert found == {"sniffio", "AsyncClient"}
    assert {_name(d) for d in packages_distributions()["sniffio"]} == {"sniffio"}
    assert "sniffio" in required and "openai" not in required
