"""One line for bad input, however deep the option sits.

jsonargparse reports a bad value inside a nested object (an environment's or a callback's ``init_args``) as a tree of
Union alternatives many lines long. The command line prints one line naming the flag instead:

- **while parsing** (a wrong type, an unknown key): :class:`OneLineErrorParser` walks the chain of exceptions that
  jsonargparse wrapped around the real problem (``Parser key "data"`` → ``Parser key "env"`` → ``Parser key "size"``
  → ``Expected a <class 'int'>``) and rebuilds the flag from the keys: ``--data.init_args.env.init_args.size``;
- **while building** (a constructor's ``ValueError``): environments and callbacks are built deep inside other
  objects, so their constructors raise messages that start with the bare argument name (``size must be >= 3``) and
  :func:`tag_constructor_errors` (a jsonargparse instantiator) records which class refused;
  :func:`constructor_error_line` then prefixes the path the class was configured under. The data module's and the
  model's own constructors name their flags themselves (``--data.init_args.batch_size must be > 0``).

Callbacks are a list, and ``--trainer.callbacks.init_args.X`` on the command line sets the *last* one; a callback
from a config file is named by its position and class: ``trainer.callbacks[1] (callbacks.schedule.PeriodicEvaluation)
every_n_frames must be >= 1, got 0``.
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import contextlib
import dataclasses
import difflib
import functools
import inspect
import logging
import multiprocessing
import multiprocessing.synchronize
import multiprocessing.util
import os
import pydoc
import re
import sys
import traceback
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser
from torchrl.envs import EnvBase

from checkpoints.files import CheckpointMismatch
from datamodules.workers import CannotCollect, WorkerDied, error_chain
from modules.spaces import SpaceError

#: The project's packages a moved class is looked for in (:func:`moved_class_path`).
PROJECT_PACKAGES = ("envs", "datamodules", "modules", "checkpoints", "callbacks", "export", "app")
_ROOT = Path(__file__).resolve().parent.parent

#: Where each kind of nested object is configured, as config keys (each key after the first is inside ``init_args``).
COMPONENT_KEYS: dict[type, tuple[str, ...]] = {EnvBase: ("data", "env"), Callback: ("trainer.callbacks",)}
_LIST_KEY = "trainer.callbacks"

# The wrappers jsonargparse puts around a problem; each names at most a key or a class on the way down.
_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS_PATH = re.compile(r"class_path[ =]'([^']+)'")
_UNION = "Does not validate against any of the Union subtypes"
_UNKNOWN_OPTION = re.compile(r"Option '([^']+)' is not accepted")
_EXPECTED = re.compile(r"Expected an? (.+?)\. Got value: (.*)", re.DOTALL)
_NOT_A_PATH = re.compile(r"Expected a path but (\S+) either not accessible or invalid")
_UNRECOGNIZED_NESTED = re.compile(r"unrecognized arguments: --([\w.]+)=.*")
_NOT_A_GROUP = re.compile(r'Unable to load config "(.*)"')


class ComponentError(ValueError):
    """A nested object's constructor refused its arguments; remembers which class and arguments it was."""

    def __init__(self, component: type, init_args: dict[str, Any], error: Exception) -> None:
        super().__init__(str(error))
        self.component, self.init_args = component, init_args

    def __reduce__(self):
        # Sent to another process (a worker's env factory failing), it travels as the plain error it wraps.
        return ValueError, self.args


def tag_constructor_errors(class_type: type, *args: Any, **kwargs: Any) -> Any:
    """jsonargparse instantiator: build ``class_type``, turning its ``ValueError`` into a :class:`ComponentError`."""
    try:
        return class_type(*args, **kwargs)
    except (ValueError, MisconfigurationException) as error:
        raise ComponentError(class_type, kwargs, error) from error


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def typed(flag: str, argv: Sequence[str]) -> bool:
    """Whether ``flag`` was given on the command line ``argv`` (as ``flag value`` or ``flag=value``)."""
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in argv)


def _name(
    keys: Sequence[str], class_path: str | None, argv: Sequence[str], index: int | None = None, last: bool = True
) -> str:
    """How to point at an option: its flag, or for a callback from a config file its entry in the list.

    ``index`` is the callback's position in ``trainer.callbacks`` when known; a flag typed on the command line
    (``--trainer.callbacks.init_args.X``) only ever reaches the ``last`` one.
    """
    flag = "--" + ".init_args.".join(keys)
    if keys[0] != _LIST_KEY or (typed(flag, argv) and last):
        return flag
    position = "" if index is None else f"[{index}]"
    return " ".join((f"{_LIST_KEY}{position} ({class_path})", *keys[1:]))


def _import_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _parameters(class_path: str | None) -> list[str]:
    cls = pydoc.locate(class_path) if class_path else None
    if not inspect.isclass(cls):
        return []
    # The constructor's own signature: TorchRL environments define a __new__ that would hide it.
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [
        p.name for p in parameters if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def moved_class_path(class_path: str) -> str | None:
    """Where the class of a ``class_path`` that no longer imports lives now: the project's one class of that name
    (``datamodules.envs.snake.env.SnakeEnv`` → ``envs.snake.env.SnakeEnv``), found in the source whatever layout the
    old path is from, so that no table of old paths has to be kept. None: the path still imports, or no single class
    of the project has its name (a user's own class, a typo)."""
    module, _, name = class_path.rpartition(".")
    if not module or module.split(".")[0] not in PROJECT_PACKAGES:
        return None
    try:
        if pydoc.locate(class_path) is not None:
            return None
    except pydoc.ErrorDuringImport:  # the module is there but does not import here (a missing extra): not moved
        return None
    found = project_classes().get(name, [])
    return found[0] if len(found) == 1 else None


@functools.cache
def project_classes() -> dict[str, list[str]]:
    """``{class name: [its import paths]}`` of every top-level class in the project's packages, read from the source
    (nothing is imported)."""
    classes: dict[str, list[str]] = {}
    for package in PROJECT_PACKAGES:
        for path in sorted((_ROOT / package).rglob("*.py")):
            parts = path.relative_to(_ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, []).append(f"{module}.{node.name}")
    return classes


def _group_fields(class_path: str | None, group: Sequence[str]) -> list[str]:
    """The option names of the (dataclass) group ``group`` of ``class_path``'s constructor, e.g. ``optimizer``."""
    cls = pydoc.locate(class_path) if class_path else None
    for part in group:
        if not inspect.isclass(cls):
            return []
        annotation = inspect.signature(cls.__init__).parameters.get(part)
        cls = typing.get_type_hints(cls.__init__).get(part) if annotation is not None else None
    return list(getattr(cls, "__dataclass_fields__", {}))


#: The version whose command line no longer recognises the options that moved into option groups under another name:
#: a group's field that was a flat option says which in its metadata (``field(..., metadata={"formerly": "tau"})``),
#: and these hints read it until then (a test fails once the project's version reaches it).
FORMER_NAMES_REMOVED_IN = "0.2.0"


def _group_holding(class_path: str | None, option: str) -> tuple[str, str] | None:
    """The option group (a dataclass parameter of ``class_path``'s constructor, such as an agent's ``optimizer``) and
    its field that a flat option named ``option`` moved to: the field that was formerly that option (its metadata's
    ``formerly``), else a field of that name; None if no group has one."""
    cls = pydoc.locate(class_path) if class_path else None
    groups = {
        name: dataclasses.fields(hint)
        for name, hint in _constructor_hints(cls).items()
        if dataclasses.is_dataclass(hint) and isinstance(hint, type)
    }
    for matches in (lambda field: field.metadata.get("formerly") == option, lambda field: field.name == option):
        for group, fields in groups.items():
            for field in fields:
                if matches(field):
                    return group, field.name
    return None


def regrouped_options(class_path: str | None, init_args: Any) -> dict[str, dict[str, Any]]:
    """``{group: {field: value}}``: where the options of ``init_args`` (a config's mapping for ``class_path``) that
    are no arguments of its constructor, or give a scalar where it takes a group, moved within its option groups; ``{}``
    when none did."""
    if not isinstance(init_args, collections.abc.Mapping):
        return {}
    hints = _constructor_hints(pydoc.locate(class_path) if class_path else None)
    moved: dict[str, dict[str, Any]] = {}
    for option, value in init_args.items():
        grouping = dataclasses.is_dataclass(hints.get(option))
        if option in hints and not (grouping and not isinstance(value, collections.abc.Mapping)):
            continue
        holder = _group_holding(class_path, option)
        if holder is not None:
            group, field = holder
            given = init_args.get(group) if group != option else None  # the group's own fields, when it has some
            moved.setdefault(group, dict(given) if isinstance(given, collections.abc.Mapping) else {})[field] = value
    return moved


def _config_files(argv: Sequence[str]) -> list[str]:
    files = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
    return files + [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]


def regroup_line(argv: Sequence[str]) -> str | None:
    """One line for a config (a run's saved ``config.yaml`` from before the option groups) whose model or data module
    gives options that now sit in groups: the file, and for each of the two the groups to write in place of those
    options, with the file's values. None when no config on the command line has such options."""
    class_paths: dict[str, str | None] = {}
    for file in _config_files(argv):
        try:
            config = yaml.safe_load(Path(file).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        parts = []
        for owner in ("model", "data"):
            entry = config.get(owner) if isinstance(config, dict) else None
            if not isinstance(entry, dict):
                continue
            class_path = entry.get("class_path") or class_paths.get(owner)
            class_paths[owner] = class_path = moved_class_path(class_path) or class_path if class_path else None
            init_args = entry.get("init_args")
            moved = regrouped_options(class_path, init_args)
            if moved:
                old = [option for option, value in init_args.items() if regrouped_options(class_path, {option: value})]
                groups = yaml.safe_dump(moved, default_flow_style=True, sort_keys=False, width=10**6).strip()[1:-1]
                parts.append(f"under {owner}.init_args write {groups} in place of {', '.join(old)}")
        if parts:
            return f"{file}: options moved into option groups; {'; '.join(parts)}"
    return None


def config_syntax_line(files: Sequence[str]) -> str | None:
    """One line for the first of the ``--config`` files that is not valid YAML: the file, the line and column where
    the parser gave up, and why. None when every one parses (or is missing: the caller names a missing file)."""
    for file in files:
        try:
            yaml.safe_load(Path(file).read_text(encoding="utf-8"))
        except OSError:
            continue  # a missing file: the parser's own error names it
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark or error.context_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            return f"--config {file}: not valid YAML at {where}{error.problem or error.context}"
        except yaml.YAMLError as error:
            return f"--config {file}: not valid YAML: {_one_line(str(error))}"
    return None


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, printing bad input as the one line ``<prog>: error: ...`` (no usage dump above it), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def check_config_files(parser: argparse.ArgumentParser, files: Sequence[str]) -> None:
    """The ``--config`` files of a command outside Lightning's CLI: each exists and is valid YAML, else the
    parser's one error line names it."""
    for file in files:
        if not Path(file).is_file():
            parser.error(f"--config {file}: no such file")
    syntax = config_syntax_line(files)
    if syntax:
        parser.error(syntax)


def _expected(type_text: str, value: str) -> str:
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", type_text)
    if literal:
        return f"must be one of {literal.group(1)}, got {value!r}"
    type_text = re.sub(r"<class '(?:builtins\.)?([\w.]+)'>", r"\1", type_text)
    return f"must be {'an' if type_text[:1] in 'aeiou' else 'a'} {type_text}, got {value!r}"


def parse_error_line(message: str, error: BaseException | None, argv: Sequence[str]) -> str:
    """One line for a parse failure: the full flag of the deepest key and the reason jsonargparse gave for it."""
    syntax = config_syntax_line(_config_files(argv))
    if syntax:  # YAML's own message names no file ("<unicode string>"): the config that does not parse comes first
        return syntax
    keys: list[str] = []
    class_path = None
    leaf = None
    moved = None  # (old, new): a class path under a module that moved
    for leaf in error_chain(error):
        text = str(leaf)
        key = _PARSER_KEY.match(text)
        if key and (not keys or keys[-1] != key.group(1)):
            keys.append(key.group(1))
        mentioned = None if text.startswith(_UNION) else _CLASS_PATH.search(text)
        class_path = mentioned.group(1) if mentioned else class_path  # the deepest class mentioned is the owner
        for given in (*_NOT_A_PATH.findall(text), *_CLASS_PATH.findall(text)):  # the flag's value, a config's
            moved = (given, moved_class_path(given)) if moved_class_path(given) else moved
    if leaf is None or not keys:
        return _one_line(message)
    regroup = regroup_line(argv)
    if regroup:  # a config from before the option groups: every option it must move, at once
        return regroup
    if moved:
        flag = _name(keys, class_path, argv)
        return f"{flag}: {moved[0]} moved to {moved[1]}; give {flag} {moved[1]} (or class_path: {moved[1]} in a config)"
    reason = _one_line(str(leaf))
    nested = _UNRECOGNIZED_NESTED.fullmatch(reason)
    if nested:  # an unknown key inside an option group (--model.init_args.optimizer.lrr)
        *group, option = nested.group(1).split(".")
        name = ".".join([_name([*keys, group[0]] if group else [*keys, option], class_path, argv), *group[1:]])
        name += f".{option}" if group else ""
        close = difflib.get_close_matches(option, _group_fields(class_path, group), n=1)
        return f"{name} is not an option" + (f"; did you mean {close[0]}?" if close else "")
    unknown = _UNKNOWN_OPTION.fullmatch(reason)
    expected = _EXPECTED.fullmatch(reason)
    if unknown:
        keys.append(unknown.group(1))
        name = _name(keys, class_path, argv)
        holder = _group_holding(class_path, unknown.group(1))
        if holder is not None:  # an option of one of the class's option groups, given on its own
            (group, option), group_flag = holder, _name([*keys[:-1], holder[0]], class_path, argv)
            return f"{name} moved: give {group_flag}.{option} ({group}: {{{option}: ...}} in a config)"
        close = difflib.get_close_matches(unknown.group(1), _parameters(class_path), n=1)
        owner = "" if not class_path or class_path in name else f" of {class_path}"
        if name.startswith(f"--{_LIST_KEY}."):
            owner += f", the last of {_LIST_KEY} (the one this flag sets)"
        return f"{name} is not an option{owner}" + (f"; did you mean {close[0]}?" if close else "")
    name = _name(keys, class_path, argv)
    if expected:
        return f"{name} {_expected(expected.group(1), expected.group(2))}"
    scalar = _NOT_A_GROUP.search(reason)
    holder = _group_holding(class_path, keys[-1]) if scalar else None
    if holder is not None and holder[0] == keys[-1]:  # a group's former flat option (network: mlp → network.kind)
        (group, option), value = holder, scalar.group(1)
        return f"{name} is an option group: give {name}.{option} {value} ({group}: {{{option}: {value}}} in a config)"
    return f"{name}: {reason}"


def _callback_index(component: type, init_args: dict[str, Any], config: Any) -> tuple[int | None, bool]:
    """Position of the refused callback in ``trainer.callbacks`` (None if not found), and whether it is the last."""
    entries = config["trainer"].get("callbacks") if config is not None else None
    entries = entries if isinstance(entries, list) else [entries]
    matches = [i for i, entry in enumerate(entries) if pydoc.locate(getattr(entry, "class_path", "")) is component]
    # Two callbacks of one class: the one whose arguments were refused.
    same_args = [i for i in matches if vars(entries[i].get("init_args") or {}).items() <= init_args.items()]
    found = (same_args or matches or [None])[0]
    return found, found == len(entries) - 1


def environment_name(config: Any) -> str:
    """How an error line names the configured environment: its Gymnasium id (``env_id``) if it has one, else its class
    path."""
    try:
        env = config["data"]["init_args"]["env"]
    except (KeyError, TypeError):
        return "the environment"
    init_args = getattr(env, "init_args", None)
    env_id = getattr(init_args, "env_id", None) if init_args is not None else None
    return str(env_id or getattr(env, "class_path", None) or "the environment")


def constructor_error_line(error: BaseException, config: Any, argv: Sequence[str]) -> str:
    """One line for a constructor that refused its arguments, named by the flag (or list entry) the user wrote; an
    agent that cannot act in (or read) the environment's spaces is told with the environment's name."""
    for cause in error_chain(error):
        if isinstance(cause, SpaceError):
            return _one_line(cause.naming(environment_name(config)))
        if isinstance(cause, ComponentError):
            break
        if not str(cause).startswith(_UNION):
            return _one_line(str(cause))  # names its flag itself (the data module, the model, the trainer)
    else:
        return _one_line(str(error))
    base = next(base for base in COMPONENT_KEYS if issubclass(cause.component, base))
    class_path = _import_path(cause.component)
    index, last = _callback_index(cause.component, cause.init_args, config) if base is Callback else (None, True)
    option, _, reason = str(cause).partition(" ")
    if option in _parameters(class_path):
        return f"{_name((*COMPONENT_KEYS[base], option), class_path, argv, index, last)} {_one_line(reason)}"
    where = _name(COMPONENT_KEYS[base], class_path, argv, index, last)
    where += "" if class_path in where else f" ({class_path})"
    return f"{where}: {_one_line(str(cause))}"


#: An option named the way library code names it: its config keys under the model or the data module
#: (``model.gamma``, ``data.collection.workers``, ``model.optimizer.lr``), not inside a longer name or path.
_OPTION_MENTION = re.compile(r"(?<![\w./\-])(model|data)((?:\.[A-Za-z_]\w*)+)")


def _constructor_hints(cls: Any) -> dict[str, Any]:
    """``{argument: annotation}`` of ``cls``'s constructor, with those its ``**kwargs`` hand to the base classes (as
    jsonargparse reads them); ``X | None`` is ``X``. Empty for anything but a class."""
    hints: dict[str, Any] = {}
    for owner in cls.__mro__ if inspect.isclass(cls) else ():
        init = owner.__dict__.get("__init__")
        if init is None:
            continue
        parameters = list(inspect.signature(init).parameters.values())[1:]
        try:
            annotations = typing.get_type_hints(init)
        except Exception:  # an annotation that does not resolve here: the argument is known, its type is not
            annotations = {}
        for parameter in parameters:
            if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                hint = annotations.get(parameter.name)
                arguments = [argument for argument in typing.get_args(hint) if argument is not type(None)]
                if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(arguments) == 1:
                    hint = arguments[0]
                hints.setdefault(parameter.name, hint)
        if not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
            break
    return hints


def option_flag(path: str, owners: dict[str, type]) -> str | None:
    """The command-line flag of an option named by its config keys (``data.collection.workers`` →
    ``--data.init_args.collection.init_args.workers``; ``model.optimizer.lr`` → ``--model.init_args.optimizer.lr``),
    for the configured classes ``owners`` (``{"model": DQN, "data": ReplayDataModule}``); None when the first key is
    no argument of the owner's constructor (a file name such as ``model.pt``).

    The one place that spells a flag: library code names options by their config keys, and jsonargparse nests an
    object configured by class (the model, the data module, an environment, a collection strategy) under
    ``init_args`` but an option group (a dataclass) or a mapping directly."""
    owner, *keys = path.split(".")
    cls = owners.get(owner)
    if not keys or keys[0] not in _constructor_hints(cls):
        return None
    parts = [owner, "init_args"]
    for depth, key in enumerate(keys):
        parts.append(key)
        if depth == len(keys) - 1:
            break
        cls = _constructor_hints(cls).get(key)
        grouped = dataclasses.is_dataclass(cls) or typing.get_origin(cls) in (dict, collections.abc.Mapping)
        parts += [] if grouped else ["init_args"]
    return "--" + ".".join(parts)


def spell_flags(line: str, owners: dict[str, type]) -> str:
    """``line`` with each option named by its config keys (``model.gamma must be …``) spelled as the flag that sets
    it (``--model.init_args.gamma must be …``); see :func:`option_flag`."""

    def spelled(match: re.Match[str]) -> str:
        return option_flag(match.group(1) + match.group(2), owners) or match.group(0)

    return _OPTION_MENTION.sub(spelled, line)


def configured_owners(config: Any) -> dict[str, type]:
    """``{"model": class, "data": class}`` of a parsed config's ``class_path`` entries (those that import)."""
    owners = {}
    for owner in ("model", "data"):
        try:
            class_path = config[owner]["class_path"]
        except (KeyError, TypeError):
            continue
        cls = pydoc.locate(class_path) if isinstance(class_path, str) else None
        if inspect.isclass(cls):
            owners[owner] = cls
    return owners


class OneLineErrorParser(LightningArgumentParser):
    """Lightning's parser, printing any error as one ``error: ...`` line naming the flag (no usage dump)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # A nested parser's error travels up, wrapped, to the top-level one. JSONARGPARSE_DEBUG=true keeps
        # jsonargparse's own behaviour: the whole tree, raised with its traceback.
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG", "").lower() == "true":
            super().error(message, ex)
        argv = getattr(self, "args", None) or sys.argv[1:]
        line = spell_flags(parse_error_line(message, ex, argv), getattr(self, "option_owners", {}))
        sys.stderr.write(f"error: {line}\n")
        self.exit(2)

    # Every config this parser writes (the run's config.yaml, the hyperparameters a checkpoint keeps, --print_config)
    # is one its own parse_args returned, checked then against every type. jsonargparse checks it again before each
    # write by default, repeating the costliest part of the parse; what it writes unchecked is the same to the
    # byte (tests/app/test_cli.py).
    def dump(self, namespace: Any, *args: Any, skip_validation: bool = True, **kwargs: Any) -> str:
        return super().dump(namespace, *args, skip_validation=skip_validation, **kwargs)

    def save(self, namespace: Any, *args: Any, skip_validation: bool = True, **kwargs: Any) -> None:
        super().save(namespace, *args, skip_validation=skip_validation, **kwargs)


# --------------------------------------------------------------------------------- a run that stops on its own
#: Seconds a worker process still alive gets to end once killed, after a fatal error.
EXIT_GRACE_S = 5.0
_REPOSITORY = Path(__file__).resolve().parents[1]
_OUT_OF_MEMORY_TEXT = ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory", "out of memory")
#: The prefix of a C++ check that failed in torch (``[enforce fail at alloc_cpu.cpp:127] err == 0. ``): where in torch's
#: sources, not what the user can act on, and long enough to cut the allocator's own words off the line.
_TORCH_CHECK_PREFIX = re.compile(r"^\[enforce fail at [^\]]*\] [^.]*\.\s*")


def fatal_error_line(error: BaseException) -> str | None:
    """One line for an error that stops a run and that the user can act on without a traceback: a worker process
    that died (or refused a resumed checkpoint's state), or memory that could not be allocated (where, and what to
    make smaller); None for anything else (a bug: its traceback is what helps)."""
    for cause in error_chain(error):
        if isinstance(cause, WorkerDied):
            return str(cause)
        if isinstance(cause, CannotCollect):
            return spell_flags(str(cause), {"data": cause.owner})
        if isinstance(cause, CheckpointMismatch):  # refused by workers, whose shutdown then failed on their deaths
            return checkpoint_mismatch_line(cause)
    for cause in error_chain(error):
        if _out_of_memory(cause):
            return (
                f"out of memory in {_where(cause)}: {_allocator_message(cause)}; make the run "
                "smaller (--data.init_args.buffer_size, --data.init_args.batch_size or minibatch_size, "
                "--data.init_args.num_envs), or see the memory estimate printed at start (docs/guide/collection.md, "
                "'Memory and worker failures')"
            )
    return None


def checkpoint_mismatch_line(error: CheckpointMismatch) -> str:
    """The line of a resumed checkpoint that does not fit the run (``--ckpt_path``), with what to do about it."""
    return (
        f"--ckpt_path: the checkpoint does not fit this run: {error}; resume it with the config and options it was "
        "written with, or give a run of other options its own name (--trainer.logger.init_args.name)"
    )


def _allocator_message(error: BaseException) -> str:
    """The allocator's words (what it tried to allocate) on one line, without torch's check prefix, cut at 160
    characters."""
    return _TORCH_CHECK_PREFIX.sub("", _one_line(str(error))).split(" (Tried")[0][:160]


def _out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(text in str(error) for text in _OUT_OF_MEMORY_TEXT[:2])


def _where(error: BaseException) -> str:
    """Which part of the run allocated: the last frame of the project's own code in the error's traceback."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = Path(frame.filename).resolve()
        # A virtual environment inside the checkout (.venv) holds the libraries' code, not the project's.
        if _REPOSITORY not in path.parents or "site-packages" in path.parts:
            continue
        part = path.relative_to(_REPOSITORY).parts[0]
        place = f"{path.relative_to(_REPOSITORY)}:{frame.lineno} {frame.name}"
        if part == "datamodules":
            return f"the collection (collecting or storing experience, {place})"
        if part == "modules":
            return f"the update ({place})"
        return place
    return "the learner"


def exit_on_fatal_error(error: BaseException) -> None:
    """Print ``error``'s one line and end the process with status 1 if it is a fatal error the user can act on
    (:func:`fatal_error_line`); return otherwise.

    Lightning has already stopped the run (the data module's ``on_exception`` tore the collection down, the loggers
    were finalised). The interpreter's own exit would then join what TorchRL left behind: a worker killed while the
    collectors were being built left a thread and a process join waiting for good (issue 30: a run that did not exit
    for half an hour), so the process ends here, after killing any worker process still alive."""
    line = fatal_error_line(error)
    if line is not None:
        exit_now(line)


def exit_now(line: str) -> NoReturn:
    """Print ``error: <line>`` and end the process with status 1 at once, after killing any worker process still
    alive: what TorchRL left of a run whose workers died would otherwise keep the interpreter from exiting
    (:func:`exit_on_fatal_error`)."""
    sys.stderr.write(f"error: {line}\n")
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=EXIT_GRACE_S)
    _release_named_semaphores()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _release_named_semaphores() -> None:
    """Unlink the named semaphores this process made for its workers' queues and locks, as its normal exit would
    (``os._exit`` skips that): ``multiprocessing``'s resource tracker would otherwise unlink them itself and print a
    warning about "leaked semaphore objects" after the error line."""
    # multiprocessing.util._finalizer_registry (private; CPython 3.11): the Finalize callbacks an exit runs, among them
    # each named semaphore's SemLock._cleanup (sem_unlink, then the tracker told). Calling one runs it once.
    for finalizer in list(multiprocessing.util._finalizer_registry.values()):
        if finalizer._callback is multiprocessing.synchronize.SemLock._cleanup:
            with contextlib.suppress(OSError):  # already unlinked
                finalizer()
