"""The packages' import directions, read from the source: environments never import the agents, and the export loader
needs nothing of the training stack."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included), as dotted names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def offending_imports(files: list[Path], forbidden: tuple[str, ...], root: Path = ROOT) -> dict[str, list[str]]:
    """``{file: [imports of a forbidden top-level package]}`` for the files that have any."""
    found = {}
    for path in files:
        bad = sorted(name for name in imported_modules(path) if name.split(".")[0] in forbidden)
        if bad:
            found[str(path.relative_to(root))] = bad
    return found


def test_the_scanner_sees_top_level_and_nested_imports(tmp_path):
    # Without this, a scanner that saw nothing would let every layout test below pass.
    sample = tmp_path / "sample.py"
    sample.write_text("import a.b\nfrom c import d\nfrom . import e\n\ndef f():\n    from modules.x import y\n")
    assert imported_modules(sample) == {"a.b", "c", "modules.x"}
    assert offending_imports([sample], ("modules", "a"), root=tmp_path) == {"sample.py": ["a.b", "modules.x"]}


def test_datamodules_never_import_the_agents_package():
    files = sorted((ROOT / "datamodules").rglob("*.py"))
    assert ROOT / "datamodules" / "envs" / "physics.py" in files  # the dynamics live with the environments
    assert offending_imports(files, ("modules", "callbacks", "app", "export")) == {}


def test_the_export_loader_needs_only_torch():
    # A deployment loads a traced policy without Lightning, TorchRL or this project's training code; of compat/ it
    # imports the torch module alone (compat/__init__.py imports nothing).
    training = ("lightning", "torchrl", "tensordict", "jsonargparse", "app", "modules", "datamodules", "callbacks")
    loader = ROOT / "export" / "loader.py"
    assert {name for name in imported_modules(loader) if name.split(".")[0] == "compat"} == {"compat.torch"}
    assert offending_imports([loader, ROOT / "compat" / "__init__.py", ROOT / "compat" / "torch.py"], training) == {}


def test_compat_imports_nothing_of_the_project():
    # The dependencies' private API behind one boundary, below everything else: it may import only the dependencies.
    files = sorted((ROOT / "compat").rglob("*.py"))
    assert ROOT / "compat" / "torchrl.py" in files
    project = ("app", "modules", "datamodules", "callbacks", "export", "benchmarks", "tests", "configs")
    assert offending_imports(files, project) == {}
