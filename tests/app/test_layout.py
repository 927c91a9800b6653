"""The packages' import directions, read from the source: app/ (the entry points) is the top and nothing below imports
it, not even through another of the project's modules; environments never import the agents; export/ is library code
that imports nothing of the training stack, and its loader needs only torch."""

from __future__ import annotations

import ast
import contextlib
import io
import pickle
from pathlib import Path

import pytest
import yaml

from app.cli import build
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


def module_files(name: str, root: Path = ROOT) -> list[Path]:
    """The project's files that importing the dotted ``name`` runs: each package's ``__init__.py`` on the way and the
    module itself (``export.tracing`` → ``export/__init__.py``, ``export/tracing.py``); none for other packages."""
    files, parts = [], name.split(".")
    for depth in range(1, len(parts) + 1):
        folder = root.joinpath(*parts[:depth])
        for candidate in (folder / "__init__.py", folder.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
    return files


def project_imports(path: Path, root: Path = ROOT) -> list[Path]:
    """The project's files that ``path`` imports, at any depth; ``from package import name`` counts the submodule
    ``name`` when there is one."""
    names = set(imported_modules(path))
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted({file for name in names for file in module_files(name, root)})


def within(name: str, forbidden: tuple[str, ...]) -> bool:
    """Whether the dotted module ``name`` is one of the ``forbidden`` packages or modules, or inside one."""
    return any(name == package or name.startswith(f"{package}.") for package in forbidden)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def offending_chains(files: list[Path], forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """Every import of a forbidden package (top-level, ``app``, or dotted, ``envs.racing``) that ``files`` make,
    directly or through the project's own modules, as ``a.py -> b.py: the.import``: a lazy import in a function counts,
    and so does one made by a module that a file imports (``callbacks/x.py -> export/y.py: app.cli`` puts app/ under
    callbacks/ all the same)."""
    # One search from all the files at once: each file is reached once, by the shortest chain from one of them.
    found = []
    chains = {start: [start] for start in files}
    queue = list(files)
    while queue:
        path = queue.pop(0)
        chain = " -> ".join(str(p.relative_to(root)) for p in chains[path])
        found += [f"{chain}: {name}" for name in sorted(imported_modules(path)) if within(name, forbidden)]
        for target in project_imports(path, root):
            if target not in chains and not within(module_name(target, root), forbidden):
                chains[target] = [*chains[path], target]
                queue.append(target)
    return found


def test_the_scanner_sees_top_level_and_nested_imports(tmp_path):
    # Without this, a scanner that saw nothing would let every layout test below pass.
    sample = tmp_path / "sample.py"
    sample.write_text("import a.b\nfrom c import d\nfrom . import e\n\ndef f():\n    from modules.x import y\n")
    assert imported_modules(sample) == {"a.b", "c", "modules.x"}
    assert offending_imports([sample], ("modules", "a"), root=tmp_path) == {"sample.py": ["a.b", "modules.x"]}


def test_datamodules_never_import_the_agents_package():
    files = sorted((ROOT / "datamodules").rglob("*.py"))
    assert ROOT / "datamodules" / "replay.py" in files
    assert offending_imports(files, ("modules", "callbacks", "app", "export")) == {}


#: The environment families: each a sub-package of envs/ holding everything it owns.
FAMILIES = tuple(
    f"envs.{folder.name}" for folder in sorted((ROOT / "envs").iterdir()) if (folder / "__init__.py").is_file()
)


def test_every_family_is_a_room_of_envs():
    assert {"envs.snake", "envs.safety", "envs.racing", "envs.mettagrid", "envs.mario", "envs.gym"} <= set(FAMILIES)
    assert not (ROOT / "datamodules" / "envs").exists()


def test_the_chain_scanner_sees_a_family_inside_a_package(tmp_path):
    # Without this, a scanner blind to dotted names would let the family tests below pass.
    (tmp_path / "envs" / "racing").mkdir(parents=True)
    for path in ("envs/__init__.py", "envs/racing/__init__.py", "envs/racing/env.py", "envs/base.py"):
        (tmp_path / path).write_text("")
    (tmp_path / "shared.py").write_text("from envs.base import x\n\ndef f():\n    from envs.racing.env import y\n")
    assert offending_chains([tmp_path / "shared.py"], ("envs.racing",), tmp_path) == ["shared.py: envs.racing.env"]


#: What no family may be imported by: the shared rooms, and the environments' own shared files (the contract, the
#: token format, the counter-based streams, drawing), directly or through anything they import.
SHARED = ("modules", "datamodules", "checkpoints", "callbacks", "export", "compat", "app")


@pytest.mark.parametrize("room", [*SHARED, "envs (shared files)"])
def test_shared_code_imports_no_family(room):
    if room.startswith("envs"):
        files = sorted((ROOT / "envs").glob("*.py"))
        assert ROOT / "envs" / "base.py" in files
    else:
        files = sorted((ROOT / room).rglob("*.py"))
    assert files
    assert offending_chains(files, FAMILIES) == []


def test_the_environment_contract_imports_only_its_dependencies_and_compat():
    files = sorted((ROOT / "envs").glob("*.py"))
    assert offending_imports(files, ("modules", "datamodules", "callbacks", "app", "export")) == {}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_imports_no_other_family_and_no_agent(family):
    files = sorted((ROOT / family.replace(".", "/")).rglob("*.py"))
    others = tuple(other for other in FAMILIES if other != family)
    assert offending_chains(files, (*others, "modules", "app")) == []


def test_the_export_loader_needs_only_torch():
    # A deployment loads a traced policy without Lightning, TorchRL or this project's training code; of compat/ it
    # imports the torch module alone (compat/__init__.py imports nothing).
    training = (
        "lightning",
        "torchrl",
        "tensordict",
        "jsonargparse",
        "app",
        "modules",
        "datamodules",
        "envs",
        "callbacks",
    )
    loader = ROOT / "export" / "loader.py"
    assert {name for name in imported_modules(loader) if name.split(".")[0] == "compat"} == {"compat.torch"}
    assert offending_imports([loader, ROOT / "compat" / "__init__.py", ROOT / "compat" / "torch.py"], training) == {}


def test_the_chain_scanner_follows_the_projects_own_imports(tmp_path):
    # Without this, a scanner that followed nothing would let the layer tests below pass.
    for folder in ("low", "mid", "app"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "low" / "a.py").write_text("from mid import b\nimport torch\n")
    (tmp_path / "mid" / "b.py").write_text("def f():\n    from app.c import g\n")
    (tmp_path / "app" / "c.py").write_text("")
    assert module_files("mid.b", tmp_path) == [tmp_path / "mid" / "__init__.py", tmp_path / "mid" / "b.py"]
    assert project_imports(tmp_path / "low" / "a.py", tmp_path) == module_files("mid.b", tmp_path)
    assert offending_chains([tmp_path / "low" / "a.py"], ("app",), tmp_path) == ["low/a.py -> mid/b.py: app.c"]
    assert offending_chains([tmp_path / "low" / "a.py"], ("torch",), tmp_path) == ["low/a.py: torch"]


# Below the entry points (app/), each package and what it never imports, directly or through the project's own
# modules. The app builds the model and data module, resolves pipeline stages and runs the command-line tools; the
# agents, callbacks and export library are handed what they need.
LAYERS = {
    "checkpoints": ("app", "modules", "datamodules", "envs", "callbacks", "export"),
    "envs": ("app",),
    "modules": ("app",),
    "callbacks": ("app",),
    "export": ("app", "modules", "datamodules", "envs", "callbacks"),
}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_nothing_below_the_app_imports_it(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert len(files) >= 2
    assert offending_chains(files, LAYERS[package]) == []


def test_compat_imports_nothing_of_the_project():
    # The dependencies' private API behind one boundary, below everything else: it may import only the dependencies.
    files = sorted((ROOT / "compat").rglob("*.py"))
    assert ROOT / "compat" / "torchrl.py" in files
    project = (
        "app",
        "modules",
        "datamodules",
        "envs",
        "checkpoints",
        "callbacks",
        "export",
        "benchmarks",
        "tests",
        "configs",
    )
    assert offending_imports(files, project) == {}


def data_module_reads(path: Path) -> set[str]:
    """What a file reads of a data module: ``<x>.datamodule.<name>``, ``datamodule.<name>`` and
    ``getattr(datamodule, "<name>")``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Attribute) and owner.attr == "datamodule") or (
                isinstance(owner, ast.Name) and owner.id == "datamodule"
            ):
                names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Name) and target.id == "datamodule" and isinstance(node.args[1], ast.Constant):
                names.add(node.args[1].value)
    return names


def test_the_scanner_sees_what_a_file_reads_of_its_data_module(tmp_path):
    sample = tmp_path / "agent.py"
    sample.write_text(
        "def f(self, datamodule):\n    self.datamodule.frames\n    datamodule.bptt\n    getattr(datamodule, 'x')\n"
    )
    assert data_module_reads(sample) == {"frames", "bptt", "x"}


def test_the_agents_read_nothing_of_their_data_module_beyond_the_data_source_protocol():
    from datamodules.source import DATA_SOURCE_MEMBERS

    reads = {path.name: data_module_reads(path) for path in sorted((ROOT / "modules").glob("*.py"))}
    assert set().union(*reads.values()) >= {"frames", "after_update", "next_ready_batch", "batches_ready", "timer"}
    beyond = {name: sorted(found - DATA_SOURCE_MEMBERS) for name, found in reads.items() if found - DATA_SOURCE_MEMBERS}
    assert beyond == {}


@pytest.mark.parametrize("module", ["replay.ReplayDataModule", "rollout.RolloutDataModule"])
def test_every_data_module_is_a_data_source(module):
    import importlib
    from functools import partial

    from datamodules.source import DataSource
    from envs.testing.chain import ChainEnv

    path, name = module.split(".")
    data = getattr(importlib.import_module(f"datamodules.{path}"), name)(partial(ChainEnv), num_envs=32)
    assert isinstance(data, DataSource)


def import_cycles(files: list[Path], root: Path = ROOT) -> list[list[str]]:
    """The import circles among ``files`` (an import under ``TYPE_CHECKING`` or in a function counts), each as the
    files on it."""
    graph = {path: [target for target in project_imports(path, root) if target in files] for path in files}
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(path: Path, stack: list[Path]) -> None:
        state[path] = 1
        for target in graph[path]:
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :]
                cycles.append([str(p.relative_to(root)) for p in cycle])
            elif target not in state:
                visit(target, [*stack, target])
        state[path] = 2

    for path in files:
        if path not in state:
            visit(path, [path])
    return cycles


def test_the_cycle_finder_sees_a_circle_through_a_type_checking_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import x\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import y\n"
    )
    files = sorted((tmp_path / "pkg").glob("*.py"))
    assert import_cycles(files, tmp_path) == [["pkg/a.py", "pkg/b.py"]]


@pytest.mark.parametrize("room", ["datamodules", "envs", "checkpoints", "callbacks", "modules", "export"])
def test_no_import_circle_in_a_room(room):
    assert import_cycles(sorted((ROOT / room).rglob("*.py"))) == []


def test_what_a_worker_process_imports_needs_no_lightning():
    # A worker process imports its environment factory (datamodules/workers.py) and its environment's family; with
    # Lightning on that path (checkpoints/files.py once imported its checkpoint plugin) each worker paid seconds of
    # imports at start. A family's data module and callbacks (racing's demonstrations, closed-loop evaluation) run in
    # the learner and may use Lightning.
    learner_only = {ROOT / "envs" / "racing" / "demonstrations.py", ROOT / "envs" / "racing" / "closed_loop.py"}
    files = [ROOT / "datamodules" / "workers.py", *sorted(set((ROOT / "envs").rglob("*.py")) - learner_only)]
    assert ROOT / "envs" / "mettagrid" / "env.py" in files
    assert offending_chains(files, ("lightning", "pytorch_lightning")) == []


def test_the_policy_a_collector_worker_receives_needs_no_lightning(tmp_path, monkeypatch):
    # A collector worker unpickles the acting policy it is sent, which imports every module the policy's classes are
    # defined in. DQN's ε-greedy, TD3's exploration and QR-DQN's head once lived in their agents' files, which import
    # Lightning: every collector worker of those agents imported it (about a second of a core each). One shipped config
    # per agent, its policy pickled as a collector sends it.
    configs = {}
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        model = (yaml.safe_load(path.read_text()) or {}).get("model")
        if isinstance(model, dict) and "class_path" in model:
            configs.setdefault(model["class_path"], path)
    assert {"modules.dqn.DQN", "modules.qrdqn.QRDQN", "modules.td3.TD3", "modules.sac.SAC"} <= set(configs)
    named: set[str] = set()

    class Names(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            named.add(module)
            return super().find_class(module, name)

    monkeypatch.chdir(tmp_path)  # building a config makes its logger's folder
    for path in configs.values():
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            model, _ = build([str(path)])
        Names(io.BytesIO(pickle.dumps(model.policy()))).load()
    ours = sorted(ROOT / f"{module.replace('.', '/')}.py" for module in named)
    ours = [path for path in ours if path.exists()]
    assert {"exploration.py", "quantiles.py", "networks.py"} <= {path.name for path in ours}
    assert offending_chains(ours, ("lightning", "pytorch_lightning")) == []


#: The strategies' own files: the only ones that may know which strategy collects.
STRATEGY_FILES = {ROOT / "datamodules" / "collection.py", ROOT / "datamodules" / "delivery.py"}


def strategy_questions(path: Path, interface: set[str], strategies: set[str]) -> list[str]:
    """Where a file asks which collection strategy it has: ``isinstance``/``issubclass``/``type(...) is`` against a
    strategy class, or a read of ``<x>.collection.<name>`` where ``name`` is no member of the strategies' common
    ``interface`` (one strategy's own option or method)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        function = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
        if function in ("isinstance", "issubclass"):
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} if len(node.args) > 1 else set()
            found += [f"{path.name}:{node.lineno}: {function} {name}" for name in sorted(named & strategies)]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            call = node.left
            if isinstance(call.func, ast.Name) and call.func.id == "type":
                named = {n.id for c in node.comparators for n in ast.walk(c) if isinstance(n, ast.Name)}
                found += [f"{path.name}:{node.lineno}: type {name}" for name in sorted(named & strategies)]
        elif isinstance(node, ast.Attribute):
            owner = node.value
            owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            if owner_name == "collection" and node.attr not in interface:
                found.append(f"{path.name}:{node.lineno}: collection.{node.attr}")
    return found


def strategy_interface() -> tuple[set[str], set[str]]:
    """The members every strategy has (a base instance's public ones), and the strategies' class names."""
    import datamodules.collection as collection

    strategies = {
        name
        for name, value in vars(collection).items()
        if isinstance(value, type) and issubclass(value, collection.Collection) and value is not collection.Collection
    }
    return {name for name in dir(collection.Collection()) if not name.startswith("_")}, strategies


def test_the_strategy_scanner_sees_each_way_of_asking(tmp_path):
    interface, strategies = strategy_interface()
    assert {"EnvWorkers", "AsyncCollectorWorkers"} <= strategies and "replay_delivery" in interface
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(self, data):\n"
        "    isinstance(self.collection, (InProcess, EnvWorkers))\n"
        "    type(data.collection) is AsyncCollectorWorkers\n"
        "    self.collection.learner_nice\n"
        "    data.collection.delivered(True)\n"
        "    self.collection.replay_delivery(self)\n"
    )
    assert strategy_questions(sample, interface, strategies) == [
        "sample.py:2: isinstance EnvWorkers",
        "sample.py:2: isinstance InProcess",
        "sample.py:3: type AsyncCollectorWorkers",
        "sample.py:4: collection.learner_nice",
        "sample.py:5: collection.delivered",
    ]


def test_nothing_outside_the_strategies_asks_which_strategy_collects():
    # Prefetch and asynchronous delivery are the strategies' own (datamodules/delivery.py): a data module, an agent or
    # a callback uses what every strategy offers, and never branches on which one it has.
    interface, strategies = strategy_interface()
    rooms = ("app", "callbacks", "checkpoints", "compat", "datamodules", "envs", "export", "modules")
    files = [path for room in rooms for path in sorted((ROOT / room).rglob("*.py")) if path not in STRATEGY_FILES]
    questions = [question for path in files for question in strategy_questions(path, interface, strategies)]
    assert questions == []
