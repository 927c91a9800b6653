"""The private APIs of torch, TorchRL, tensordict, Lightning and jsonargparse, behind one boundary: ``compat/``.

An upgrade of one of them fails here, naming the functions to re-check, rather than deep in a run:

- each compat module was written against one version of its dependency: another minor version fails;
- every private name a compat module lists in ``PRIVATE_API`` still exists in the installed version, and the list is
  complete (the scanner below finds nothing in the module that it does not name);
- no code outside ``compat/`` uses these dependencies' private API, read from the source (AST): imports of private
  names, private attributes of the dependencies' modules and classes, private attributes that the project's
  subclasses of their classes use, override or call through ``super()``, and private attributes of objects that the
  project does not define itself (the scanner is tested on a sample, so it cannot pass by seeing nothing).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import os
import re
import time
import tomllib
from functools import cache
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest
from torchrl.envs import GymEnv, ParallelEnv

import compat.jsonargparse
import compat.lightning
import compat.tensordict
import compat.torch
import compat.torchrl
from tests.helpers import ROOT

COMPAT_MODULES = (compat.torch, compat.torchrl, compat.tensordict, compat.lightning, compat.jsonargparse)
DEPENDENCIES = ("torch", "torchrl", "tensordict", "lightning", "jsonargparse")

# The methods TorchRL's documentation asks a subclass to implement: private by name, public by contract.
EXTENSION_HOOKS = {
    "torchrl.envs.EnvBase": {"_reset", "_step", "_set_seed"},
    "torchrl.envs.Transform": {"_apply_transform", "_inv_apply_transform", "_call", "_inv_call", "_reset", "_step"},
    "torchrl.data.replay_buffers.samplers.Sampler": {"_empty"},  # abstract
}

# Private attributes of libraries other than the five, on objects whose type the source does not show.
OTHER_LIBRARIES = {
    "_env": "nes_py's NESEnv (Mario's emulators): whether the emulator is still open",
    "_asdict": "a namedtuple's fields (envpool's task config): public by the namedtuple contract",
    "_callback": "a multiprocessing.util.Finalize's callback (CPython 3.11): which exit finalizers unlink semaphores",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _minor(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


def _functions(module: ModuleType) -> list[str]:
    return sorted({name.strip() for *_, uses in module.PRIVATE_API for name in uses.split(",")})


# ----------------------------------------------------------------------------------------------------- the scanner
class Use(NamedTuple):
    path: str  # relative to the scanned root
    line: int
    name: str  # the private name
    text: str  # what was found

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def _module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _bindings(tree: ast.AST, module: str) -> dict[str, str]:
    """``{local name: the dotted name it was imported as}`` for every import of the file, at any depth."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _is_dependency(dotted: str) -> bool:
    return dotted.split(".")[0] in DEPENDENCIES


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _attribute_string(node: ast.AST) -> tuple[ast.AST, str] | None:
    """``(obj, name)`` for ``getattr/hasattr/setattr/delattr(obj, "name", ...)``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


@cache
def _resolve(dotted: str) -> Any:
    """The object a dotted name of a dependency names (a module, or an attribute of one), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part, None)
        return found
    return None


@cache
def _private_names(cls: type) -> frozenset[str]:
    """The private names of a dependency's class: its own attributes, and those its source sets on ``self``."""
    names = {name for name in vars(cls) if _private(name)}
    with contextlib.suppress(OSError, TypeError):  # no source: a builtin or a C extension's class
        names.update(name for name in re.findall(r"self\.(_\w+)", inspect.getsource(cls)) if _private(name))
    return frozenset(names)


def _hooks(ancestors: list[type]) -> set[str]:
    hooks = set()
    for owner, names in EXTENSION_HOOKS.items():
        if _resolve(owner) in ancestors:
            hooks |= names
    return hooks


def private_uses(files: list[Path], root: Path = ROOT) -> list[Use]:
    """Every use of a private name of the :data:`DEPENDENCIES` in ``files`` (see the module docstring)."""
    trees = {path: ast.parse(path.read_text(), filename=str(path)) for path in files}
    modules = {path: _module_name(path, root) for path in files}
    bindings = {path: _bindings(tree, modules[path]) for path, tree in trees.items()}
    uses: dict[tuple[str, int, str], Use] = {}  # one per name and line: the first rule's finding

    def use(path: Path, node: ast.AST, name: str, text: str) -> None:
        found = Use(str(path.relative_to(root)), node.lineno, name, text)
        uses.setdefault(found[:3], found)

    # The files' classes by dotted name, with their bases as dotted names.
    classes: dict[str, list[str]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = []
                for base in node.bases:
                    parts = _dotted(base)
                    if parts:
                        origin = bindings[path].get(parts[0], f"{modules[path]}.{parts[0]}")
                        bases.append(".".join([origin, *parts[1:]]))
                classes[f"{modules[path]}.{node.name}"] = bases

    def dependency_ancestors(name: str) -> list[type]:
        found = []
        for base in classes.get(name, []):
            if base in classes:
                found += dependency_ancestors(base)
            elif _is_dependency(base) and isinstance(_resolve(base), type):
                found += [cls for cls in inspect.getmro(_resolve(base)) if _is_dependency(cls.__module__)]
        return found

    # 1, 2: private names imported from a dependency, or reached through a name bound to one.
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_dependency(node.module or ""):
                for alias in node.names:
                    for part in f"{node.module}.{alias.name}".split("."):
                        if _private(part):
                            use(path, node, part, f"from {node.module} import {alias.name}")
                            break
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    private = [part for part in alias.name.split(".") if _private(part)]
                    if _is_dependency(alias.name) and private:
                        use(path, node, private[0], f"import {alias.name}")
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                parts = _dotted(node)
                origin = parts and bindings[path].get(parts[0])
                if origin and _is_dependency(origin):
                    use(path, node, node.attr, ".".join([origin, *parts[1:]]))

    # 3: in a subclass of a dependency's class, that class's private names on self or super(), or overridden.
    inherited: set[str] = set()
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            ancestors = dependency_ancestors(f"{modules[path]}.{node.name}")
            if not ancestors:
                continue
            names = set().union(*(_private_names(cls) for cls in ancestors)) - _hooks(ancestors)
            where = f"({node.name} is a {ancestors[0].__module__}.{ancestors[0].__qualname__})"
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in names:
                    use(path, item, item.name, f"def {item.name} overrides a private method {where}")
                    inherited.add(item.name)
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and sub.attr in names
                    and (_is_self(sub.value) or _is_super(sub.value))
                ):
                    use(path, sub, sub.attr, f"{ast.unparse(sub)} {where}")
                    inherited.add(sub.attr)
                found = _attribute_string(sub)
                if found and found[1] in names and _is_self(found[0]):
                    use(path, sub, found[1], f"{ast.unparse(sub)} {where}")
                    inherited.add(found[1])

    # 4, 5: private attributes of other objects (or through super()) that the files do not define themselves.
    defined = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
                defined.add(node.attr)
    defined -= inherited
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined:
                if _is_self(node.value) or node.attr in OTHER_LIBRARIES:
                    continue
                parts = _dotted(node.value)
                if parts and parts[0] in bindings[path]:
                    continue  # reached through an import: a dependency's is found above, another library's is not ours
                use(path, node, node.attr, ast.unparse(node))
            found = _attribute_string(node)
            if found and _private(found[1]) and found[1] not in defined and not _is_self(found[0]):
                use(path, node, found[1], ast.unparse(node))
    return sorted(uses.values())


def _project_files() -> list[Path]:
    """The Python files of every package pyproject.toml ships, and the benchmark scripts."""
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    folders = sorted({pattern.rstrip("*").rstrip(".") for pattern in include} | {"benchmarks"})
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


# ---------------------------------------------------------------------------------------------------------- tests
def test_the_scanner_finds_each_kind_of_private_use(tmp_path):
    # Without this, a scanner that saw nothing would let the zero-use test below pass.
    package = tmp_path / "sample"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "import torch\n"  # 1
        "import torch._dynamo\n"  # 2: a private module
        "from jsonargparse import _parameter_resolvers\n"  # 3: a private name
        "from lightning.pytorch.callbacks import ModelCheckpoint\n"
        "from torch import nn\n"
        "from torchrl.collectors import Collector\n"
        "from torchrl.envs import EnvBase\n"
        "\n"
        "\n"
        "class Own:\n"  # 10
        "    def __init__(self):\n"
        "        self._own = 1\n"
        "\n"
        "\n"
        "class Checkpoint(ModelCheckpoint):\n"  # 15
        "    def _save_checkpoint(self, trainer, filepath):\n"  # 16: overrides a private method
        "        super()._save_checkpoint(trainer, filepath)\n"  # 17: calls it
        "\n"
        "\n"
        "class Carrying(Collector):\n"  # 20
        "    def state(self):\n"
        "        return self._carrier, getattr(self, '_frames')\n"  # 22: an inherited attribute, twice
        "\n"
        "\n"
        "class Env(EnvBase):\n"  # 25
        "    def _step(self, tensordict):\n"  # TorchRL's extension hook: not a private use
        "        return self._reset(tensordict)\n"
        "\n"
        "\n"
        "def f(trainer, own, transform, emulator):\n"  # 30
        "    torch._foreach_norm([])\n"  # 31: a private function of a dependency's module
        "    nn.modules.batchnorm._BatchNorm\n"  # 32: a private class, through a submodule
        "    trainer.fit_loop.epoch_loop._batches_that_stepped += 1\n"  # 33: a private attribute of another object
        "    hasattr(transform, '_buffer')\n"  # 34: the same, spelt as a string
        "    emulator._env\n"  # another library's (OTHER_LIBRARIES)
        "    return own._own\n"  # the sample's own
    )
    (package / "b.py").write_text(
        "from sample.a import Checkpoint\n"
        "\n"
        "\n"
        "class Deeper(Checkpoint):\n"
        "    def save(self, trainer):\n"
        "        return self._monitor_candidates(trainer)\n"  # 6: inherited through the sample's own class
    )
    uses = private_uses(sorted(package.glob("*.py")), root=tmp_path)
    assert {(use.path, use.line, use.name) for use in uses} == {
        ("sample/a.py", 2, "_dynamo"),
        ("sample/a.py", 3, "_parameter_resolvers"),
        ("sample/a.py", 16, "_save_checkpoint"),
        ("sample/a.py", 17, "_save_checkpoint"),
        ("sample/a.py", 22, "_carrier"),
        ("sample/a.py", 22, "_frames"),
        ("sample/a.py", 31, "_foreach_norm"),
        ("sample/a.py", 32, "_BatchNorm"),
        ("sample/a.py", 33, "_batches_that_stepped"),
        ("sample/a.py", 34, "_buffer"),
        ("sample/b.py", 6, "_monitor_candidates"),
    }, "\n".join(map(str, uses))


def test_no_private_api_of_the_dependencies_outside_compat():
    files = _project_files()
    assert ROOT / "modules" / "optim.py" in files and ROOT / "benchmarks" / "update_cost.py" in files
    outside = [path for path in files if path.relative_to(ROOT).parts[0] != "compat"]
    uses = private_uses(outside)
    assert not uses, "private API used outside compat/; move each into compat/<dependency>.py:\n" + "\n".join(
        map(str, uses)
    )


def test_compat_is_a_shipped_package():
    assert "compat" in {path.relative_to(ROOT).parts[0] for path in _project_files()}


@pytest.mark.parametrize("module", COMPAT_MODULES, ids=lambda module: module.__name__)
def test_the_installed_version_is_the_one_compat_was_written_against(module):
    installed = version(module.DISTRIBUTION)
    if _minor(installed) != _minor(module.WRITTEN_AGAINST):
        names = ", ".join(f"{owner}.{name}" for owner, name, _ in module.PRIVATE_API)
        pytest.fail(
            f"{module.DISTRIBUTION} {installed} is installed, but {module.__name__} was written against "
            f"{module.WRITTEN_AGAINST}: re-check {', '.join(_functions(module))} in compat/"
            f"{module.__name__.split('.')[-1]}.py against the new version's source ({names}), then set "
            "WRITTEN_AGAINST to it"
        )


@pytest.mark.parametrize("module", COMPAT_MODULES, ids=lambda module: module.__name__)
def test_every_private_name_compat_relies_on_still_exists(module):
    missing = []
    for owner, name, uses in module.PRIVATE_API:
        found = _resolve(owner)
        if found is None:
            missing.append(f"{owner} (for {name}) is gone: re-check {module.__name__}.{uses}")
        elif not hasattr(found, name) and not (
            isinstance(found, type)
            and any(  # an instance attribute: assigned in the class's code, or declared in its annotations
                re.search(rf"self\.{re.escape(name)}\s*(?::[^=\n]+)?=(?!=)", _class_source(cls))
                or name in cls.__dict__.get("__annotations__", {})
                for cls in inspect.getmro(found)
                if _is_dependency(cls.__module__)
            )
        ):
            missing.append(f"{owner}.{name} is gone: re-check {module.__name__}.{uses}")
    assert not missing, f"{module.DISTRIBUTION} {version(module.DISTRIBUTION)}:\n" + "\n".join(missing)


def _class_source(cls: type) -> str:
    """``cls``'s source; where ``inspect`` cannot find it (a class whose ``__module__`` names the package that
    re-exports it, as TorchRL's replay buffers do), the whole file its ``__init__`` is written in."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        init = cls.__dict__.get("__init__")
        return inspect.getsource(inspect.getmodule(init)) if inspect.isfunction(init) else ""


@pytest.mark.parametrize("module", COMPAT_MODULES, ids=lambda module: module.__name__)
def test_each_compat_module_lists_every_private_name_it_uses(module):
    path = Path(module.__file__)
    listed = {part for owner, name, _ in module.PRIVATE_API for part in (*owner.split("."), name)}
    found = private_uses([path], root=ROOT)
    assert found, f"the scanner finds no private use in {path.name}"
    assert [use for use in found if use.name not in listed] == [], f"add these to {module.__name__}.PRIVATE_API"
    for *_, uses in module.PRIVATE_API:  # each names functions or classes of the module
        for name in uses.split(","):
            assert hasattr(module, name.strip()), f"{module.__name__}.PRIVATE_API names {name.strip()}"


def test_a_lazy_instance_made_for_a_module_is_the_one_jsonargparse_makes_for_its_caller():
    import jsonargparse

    import datamodules.base
    from datamodules.collection import InProcess

    this_module = inspect.getmodule(test_compat_is_a_shipped_package)
    theirs = jsonargparse.lazy_instance(InProcess, prefetch=True)  # its class made for this module, found on the stack
    ours = compat.jsonargparse.lazy_instance(InProcess, this_module, prefetch=True)
    assert type(ours) is type(theirs)  # the class jsonargparse made for this module, found by name and reused
    assert ours.lazy_get_init_data() == theirs.lazy_get_init_data()
    default = datamodules.base.DEFAULT_COLLECTION
    assert type(default).__name__ == type(ours).__name__ and type(default).__module__ == "datamodules.base"
    assert type(default).__mro__[1:] == type(ours).__mro__[1:]
    assert default.lazy_get_init_data() == jsonargparse.lazy_instance(InProcess).lazy_get_init_data()


def test_from_any_returns_a_tensor_without_asking_the_import_system(monkeypatch):
    import importlib.util

    import torch
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    import modules.base  # noqa: F401  (installs the shortcut, as every agent's import does)

    compat.tensordict.install_from_any_tensor_shortcut()  # idempotent: a second install changes nothing
    looked_up = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: looked_up.append(name) or real_find_spec(name, *args)
    )
    tensor = torch.arange(3.0)
    assert TensorDict.from_any(tensor) is tensor
    module = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    out = module(TensorDict(x=torch.ones(4, 3), batch_size=[4]))
    assert out["y"].shape == (4, 2) and looked_up == []
    converted = TensorDict.from_any({"a": tensor})  # anything else is the original's
    assert isinstance(converted, TensorDict) and converted["a"] is tensor


class _EndsOnLoad(GymEnv):
    """A worker's environment that ends its process when handed a state (as a worker refusing a checkpoint does)."""

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        os._exit(3)


@pytest.mark.slow
def test_loading_a_parallel_envs_state_ends_at_a_workers_death_not_after_its_timeout():
    # TorchRL's load_state_dict waits out the pipe timeout for each dead worker and goes on as if loaded; ours raises
    # at once. The timeout is set to two minutes a worker, so that TorchRL's wait (four minutes) fails the bound.
    env = ParallelEnv(2, functools.partial(_EndsOnLoad, "CartPole-v1"))
    try:
        env.reset()
        env._timeout = 120.0
        started = time.monotonic()
        with pytest.raises(ConnectionError, match=r"^environment worker \d ended while loading its state$"):
            compat.torchrl.parallel_env_load_state(env, {})
        assert time.monotonic() - started < 60
    finally:
        with contextlib.suppress(RuntimeError):  # TorchRL's close reports the dead worker again
            env.close(raise_if_closed=False)


def test_a_rounds_steps_stack_as_torch_stacks_them():
    """compat.tensordict.stack_steps against ``torch.stack(steps, dim=-1)``: plain steps with a nested tensordict
    (one with a batch dimension of its own) entry by entry, and the cases it hands to torch.stack (a non-tensor entry,
    steps whose entries differ) with torch.stack's result."""
    import torch
    from tensordict import NonTensorData, TensorDict

    from compat.tensordict import stack_steps

    def step(i: int, **extra) -> TensorDict:
        generator = torch.Generator().manual_seed(i)
        return TensorDict(
            {
                "observation": torch.randn(4, 3, generator=generator),
                "action": torch.randint(2, (4,), generator=generator),
                "next": {"reward": torch.randn(4, 1, generator=generator), "done": torch.zeros(4, 1, dtype=torch.bool)},
                "recurrent": TensorDict({"h": torch.randn(4, 2, 5, generator=generator)}, batch_size=[4, 2]),
                **extra,
            },
            batch_size=[4],
        )

    def same(ours, theirs):
        assert ours.batch_size == theirs.batch_size and type(ours) is type(theirs)
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
        for key in theirs.keys(True, True, is_leaf=lambda cls: issubclass(cls, torch.Tensor)):
            assert torch.equal(ours[key], theirs[key]), key
        for key in theirs.keys(True):
            if isinstance(theirs.get(key), TensorDict):
                assert ours.get(key).batch_size == theirs.get(key).batch_size, key

    steps = [step(i) for i in range(5)]
    stacked = stack_steps(steps)
    same(stacked, torch.stack(steps, dim=-1))
    assert stacked.batch_size == (4, 5) and stacked.get("recurrent").batch_size == (4, 5, 2)
    assert stacked["observation"].data_ptr() != steps[0]["observation"].data_ptr()  # copies, as torch.stack's
    with_text = [step(i, note=NonTensorData("x", batch_size=[4])) for i in range(3)]
    same(stack_steps(with_text), torch.stack(with_text, dim=-1))
    uneven = [step(0), step(1, extra=torch.zeros(4))]
    with pytest.raises(RuntimeError):  # torch.stack's own refusal of steps whose entries differ
        stack_steps(uneven)
