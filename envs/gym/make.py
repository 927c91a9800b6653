"""Building one Gymnasium environment from the family's options, each bad option one ``ValueError`` naming it.

- ``env_id``: a registered id (``CartPole-v1``), or ``module:Id`` to import the module that registers it first
  (Gymnasium's own form: ``my_package.envs:Corridor-v0``). Ids of the ``ALE/`` namespace import ``ale_py``, which
  registers them, and so does an id registered nowhere else (ale-py's ``BreakoutNoFrameskip-v4``, the RL Zoo's ids),
  where ale-py is installed. An unknown id lists the close matches among the registered ones.
- ``env_kwargs``: keyword arguments of ``gymnasium.make`` (the environment's own, and make's: ``max_episode_steps``).
- ``wrappers``: applied in order, after Gymnasium's episode statistics (:data:`STATS_KEY`); each is a name from
  ``gymnasium.wrappers`` or a dotted class path, alone or as ``{class_path: ..., init_args: {...}}``.

A dependency that does not import (Box2D, MuJoCo, the ALE) is named with the install command of the project's ``gym``
extra, which installs all three.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
from collections.abc import Sequence
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec, load_env_creator
from gymnasium.wrappers import RecordEpisodeStatistics

from compat.extras import install_command

#: The command that installs what Gymnasium's Box2D, MuJoCo and Atari environments need (pyproject.toml's extra).
#: Modules whose environments' dependencies the ``gym`` extra installs (their entry points start with one of these).
EXTRA_MODULES = ("gymnasium.envs.box2d", "gymnasium.envs.mujoco", "ale_py")
#: Namespaces whose ids a package registers when it is imported, and that package's module.
NAMESPACE_MODULES = {"ALE": "ale_py"}
#: Packages that register ids outside a namespace when imported (ale-py: the Atari games' ``v0`` and ``v4`` ids,
#: ``BreakoutNoFrameskip-v4``), imported for an id not registered yet where they are installed.
UNNAMESPACED_MODULES = ("ale_py",)
#: The info key of the episode statistics under the user's wrappers: a key of our own, so that a user's
#: RecordEpisodeStatistics keeps its.
STATS_KEY = "lightrl_episode"


def find_spec(env_id: str) -> EnvSpec:
    """The registered spec of ``env_id`` (``module:Id`` imports ``module`` first)."""
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            raise ValueError(
                f"env_id {env_id!r}: its module {module!r} does not import ({error}); it should be the module that "
                "registers the id (gymnasium.register)"
            ) from None
        except Exception as error:  # noqa: BLE001 - the user's module failed while importing: one line naming it
            raise ValueError(
                f"env_id {env_id!r}: importing its module {module!r} failed: {type(error).__name__}: {error}"
            ) from None
    namespace = name.partition("/")[0] if "/" in name else None
    if namespace in NAMESPACE_MODULES and name not in gymnasium.registry:
        package = NAMESPACE_MODULES[namespace]
        try:
            importlib.import_module(package)
        except ModuleNotFoundError as error:
            raise ValueError(
                f"env_id {name} needs {error.name}, which is not installed: {install_command('gym')}"
            ) from None
    if name not in gymnasium.registry and namespace is None:
        for package in UNNAMESPACED_MODULES:
            with contextlib.suppress(ImportError):  # not installed: the id is unknown, and said so below
                importlib.import_module(package)
    if name not in gymnasium.registry:
        close = difflib.get_close_matches(name, list(gymnasium.registry), n=3, cutoff=0.6)
        hint = "; register it (gymnasium.register) in a module and give 'module:Id' to import it"
        if close:
            hint = f"; did you mean {close[0] if len(close) == 1 else ', '.join(close[:-1]) + ' or ' + close[-1]}?"
        if module:
            hint = f"; importing {module!r} registered no such id" + (hint if close else "")
        raise ValueError(f"env_id {name!r} is not a registered Gymnasium id{hint}")
    return gymnasium.registry[name]


def missing_dependency(error: BaseException) -> str | None:
    """The module whose import failed somewhere in ``error``'s chain (Gymnasium's ``DependencyNotInstalled`` wraps
    the ``ModuleNotFoundError``), or None."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name:
            return error.name
        error = error.__cause__ or error.__context__
    return None


def resolve_wrappers(wrappers: Sequence[str | dict[str, Any]] | None) -> list[tuple[type[gymnasium.Wrapper], dict]]:
    """Each entry of the ``wrappers`` option as ``(wrapper class, its keyword arguments)``."""
    resolved = []
    for entry in wrappers or ():
        if isinstance(entry, str):
            path, kwargs = entry, {}
        elif isinstance(entry, dict) and "class_path" in entry and set(entry) <= {"class_path", "init_args"}:
            path, kwargs = entry["class_path"], dict(entry.get("init_args") or {})
        else:
            raise ValueError(
                f"wrappers entries are a wrapper's name or {{class_path: ..., init_args: {{...}}}}, got {entry!r}"
            )
        resolved.append((wrapper_class(path), kwargs))
    return resolved


def wrapper_class(path: str) -> type[gymnasium.Wrapper]:
    """A wrapper named in ``gymnasium.wrappers``, or a dotted ``module.Class`` path to a ``gymnasium.Wrapper``."""
    found, candidates = None, gymnasium_wrapper_names()
    module, _, name = path.rpartition(".")
    if module:
        try:
            imported = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name is None or not module.startswith(error.name):  # the module is there; one it imports is not
                raise ValueError(f"wrappers names {path!r}, whose module does not import: {error}") from None
        except Exception as error:  # noqa: BLE001 - the user's module failed while importing: one line naming it
            raise ValueError(
                f"wrappers names {path!r}, whose module failed to import: {type(error).__name__}: {error}"
            ) from None
        else:
            found = getattr(imported, name, None)
            candidates = [f"{module}.{key}" for key, value in vars(imported).items() if is_wrapper_class(value)]
    else:
        with contextlib.suppress(ImportError, AttributeError):  # not in gymnasium.wrappers: refused below
            found = getattr(gymnasium.wrappers, path)
    if is_wrapper_class(found):
        return found
    close = difflib.get_close_matches(path, candidates, n=1)
    raise ValueError(
        f"wrappers names {path!r}, which is not a wrapper of gymnasium.wrappers nor the class path of a "
        "gymnasium.Wrapper" + (f"; did you mean {close[0]}?" if close else "")
    )


def is_wrapper_class(value: Any) -> bool:
    return inspect.isclass(value) and issubclass(value, gymnasium.Wrapper)


def gymnasium_wrapper_names() -> list[str]:
    """The per-environment wrappers of ``gymnasium.wrappers`` (not its vector wrappers)."""
    names = []
    for name in gymnasium.wrappers.__all__:
        try:
            value = getattr(gymnasium.wrappers, name)
        except Exception:  # noqa: BLE001 - a wrapper whose optional dependency is missing: not a suggestion
            continue
        if is_wrapper_class(value):
            names.append(name)
    return names


def draws_rgb_arrays(spec: EnvSpec) -> bool:
    """Whether the environment of ``spec`` declares the ``rgb_array`` render mode (its class's ``metadata``)."""
    try:
        creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    except (ImportError, AttributeError, gymnasium.error.Error):
        return False  # make() reports a missing package with its own line
    return "rgb_array" in (getattr(creator, "metadata", None) or {}).get("render_modes", ())


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any],
    wrappers: list[tuple[type[gymnasium.Wrapper], dict]],
    render: bool = False,
) -> tuple[gymnasium.Env, RecordEpisodeStatistics | None]:
    """``gymnasium.make(env_id, **env_kwargs)``, then ``wrappers`` in order after Gymnasium's episode statistics, and
    that statistics wrapper: its running ``episode_returns`` is the return before the wrappers change the reward,
    whichever layer ends the episode. Without wrappers there is none (None): the caller sums the rewards itself, which
    costs less than a wrapper's call per step. ``render``: made drawable (Gymnasium's ``render_mode="rgb_array"``,
    where the environment has it and ``env_kwargs`` names no render mode)."""
    spec = find_spec(env_id)
    make_kwargs = dict(env_kwargs)
    if render and "render_mode" not in make_kwargs and draws_rgb_arrays(spec):
        # Only an environment built to be drawn gets a render mode: some simulate what is only drawn whenever they
        # have one (LunarLander's exhaust particles are bodies of its physics world, 2.4x its step).
        make_kwargs["render_mode"] = "rgb_array"
    try:
        env = gymnasium.make(spec.id, **make_kwargs)
    except (ImportError, gymnasium.error.DependencyNotInstalled) as error:
        missing = missing_dependency(error) or str(error).split(" ")[0]
        extra = isinstance(spec.entry_point, str) and spec.entry_point.startswith(EXTRA_MODULES)
        raise ValueError(
            f"env_id {spec.id} needs {missing}, which is not installed"
            + (f": {install_command('gym')}" if extra else f" (its entry point: {spec.entry_point})")
        ) from None
    except Exception as error:  # noqa: BLE001 - the environment refused its options (any type): one line naming them
        reason = refusal(error)
        if env_kwargs:
            raise ValueError(f"env_kwargs {env_kwargs} do not fit {spec.id}: {reason}") from None
        raise ValueError(f"env_id {spec.id}: building the environment failed: {reason}") from None
    statistics = RecordEpisodeStatistics(env, stats_key=STATS_KEY) if wrappers else None
    env = statistics or env
    for cls, kwargs in wrappers:
        try:
            env = cls(env, **kwargs)
        except Exception as error:  # noqa: BLE001 - the wrapper refused (any type): one line naming it
            reason = refusal(error)
            raise ValueError(f"wrappers {cls.__name__}({kwargs}) does not apply to {spec.id}: {reason}") from None
    return env, statistics


def refusal(error: Exception) -> str:
    """An environment's or wrapper's refusal in words: its message, with the error's type where the message alone
    may not say what went wrong (a ``KeyError``'s is only the key)."""
    return str(error) if isinstance(error, TypeError | ValueError) else f"{type(error).__name__}: {error}"
