"""The spaces an agent acts in and reads, told from the specs, and one error line for those it cannot.

An agent is built from the specs alone (the CLI links them in from the data module's throw-away environment), so its
constructor checks them here:

- **actions**: ``discrete`` (a ``Categorical`` spec: one action of ``n``, what the environments here and Gymnasium's
  ``Discrete`` give) or ``box`` (a continuous vector: ``Bounded``, or ``Unbounded``); anything else (``OneHot``,
  ``MultiCategorical``, ``Binary``, composite actions) no agent here acts in;
- **observations**: one tensor, the entry ``observation`` (a dict of observations is refused).

A refusal is a :class:`SpaceError`, one line that names the model's flag and the environment: the model knows only the
specs, so the line says "the environment" and the command line puts in the environment's name (app/errors.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torchrl.data import Categorical, Composite, TensorSpec, Unbounded

DISCRETE, BOX = "discrete", "box"


class SpaceError(ValueError):
    """An agent cannot act in, or read, the environment's space. ``template`` names the environment as ``{env}``."""

    ENV = "{env}"

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.naming("the environment"))

    def naming(self, env: str) -> str:
        """The line with the environment's name in it."""
        return self.template.replace(self.ENV, env)


def model_name(model: Any) -> str:
    """How ``--model`` names an agent: its class path."""
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


def action_kind(spec: TensorSpec) -> str | None:
    """``discrete``, ``box``, or None for a space no agent here acts in."""
    if type(spec) is Categorical and spec.shape == ():  # one action of n (not MultiCategorical, Binary, OneHot)
        return DISCRETE
    if getattr(spec, "domain", None) == "continuous" and len(spec.shape) == 1 and not isinstance(spec, Composite):
        return BOX
    return None


def describe_action_space(spec: TensorSpec) -> str:
    """The action space in words: ``a discrete action space (Categorical, 4 actions)``, ``a Box action space (Bounded,
    shape [2], low [-6.0, -0.44], high [4.0, 0.44])``, ``an unbounded Box action space (Unbounded, shape [2])``."""
    kind, name, shape = action_kind(spec), type(spec).__name__.removesuffix("Continuous"), list(spec.shape)
    if kind == DISCRETE:
        return f"a discrete action space ({name}, {spec.space.n} actions)"
    if kind == BOX and box_bounds(spec) is None:
        return f"an unbounded Box action space ({name}, shape {shape})"
    if kind == BOX:
        low, high = (_rounded(bound) for bound in box_bounds(spec))
        return f"a Box action space ({name}, shape {shape}, low {low}, high {high})"
    return f"a {name} action space (shape {shape})"


#: The agents that act in each kind of action space, for the error line of one that does not.
AGENTS = {
    DISCRETE: "modules.dqn.DQN, modules.ppo.PPO or modules.discrete_sac.DiscreteSAC",
    BOX: "modules.sac.SAC or modules.ppo.PPO",
}


def check_action_space(model: Any, spec: TensorSpec, accepts: tuple[str, ...]) -> str:
    """The kind of ``spec`` (``discrete`` or ``box``) when ``model`` ``accepts`` it; else a :class:`SpaceError`:
    ``--model <model> acts in a discrete action space; <env> has a Box action space (...): use <the agents that do>``.
    """
    kind = action_kind(spec)
    if kind in accepts:
        return kind
    wanted = " or ".join("a discrete" if accepted == DISCRETE else "a Box" for accepted in accepts)
    advice = f": use {AGENTS[kind]}" if kind in AGENTS else ", which no agent here acts in"
    raise SpaceError(
        f"--model {model_name(model)} acts in {wanted} action space; {SpaceError.ENV} has "
        f"{describe_action_space(spec)}{advice}"
    )


def box_bounds(spec: TensorSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A Box spec's ``(low, high)`` as float tensors, or None when it is unbounded in any dimension (TorchRL's
    ``Unbounded`` spaces report the dtype's largest finite values as their bounds)."""
    if isinstance(spec, Unbounded):
        return None
    low, high = spec.space.low.float(), spec.space.high.float()
    largest = torch.finfo(low.dtype).max
    if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
        return None
    if (low.abs() >= largest).any() or (high.abs() >= largest).any():
        return None
    return low, high


def check_bounded(spec: TensorSpec, what: str, advice: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)`` of a Box action spec whose every dimension is a bounded interval, else a :class:`SpaceError`
    saying ``what`` needs the bounds."""
    bounds = box_bounds(spec)
    if bounds is None:
        raise SpaceError(f"{what}; {SpaceError.ENV} has {describe_action_space(spec)}: {advice}")
    low, high = bounds
    if not (high > low).all():
        raise SpaceError(f"{what}; {SpaceError.ENV} has {describe_action_space(spec)}, whose low is not below its high")
    return bounds


def check_flat_observation(model: Any, spec: TensorSpec) -> int:
    """The length of a vector observation, for an agent that reads only vectors; a :class:`SpaceError` otherwise."""
    if len(spec.shape) != 1:
        raise SpaceError(
            f"--model {model_name(model)} reads a flat observation vector; {SpaceError.ENV}'s observation is "
            f"{spec.dtype} of shape {list(spec.shape)}"
        )
    return spec.shape[0]


def observation_entry(model: Any, observation_spec: Any) -> TensorSpec:
    """The one observation tensor the agents read, ``observation``; a :class:`SpaceError` for a dict of observations
    (a ``Composite`` under ``observation``, or no ``observation`` entry at all)."""
    spec = observation_spec.get("observation", None) if isinstance(observation_spec, Composite) else None
    if spec is None or isinstance(spec, Composite):
        entries = observation_spec if spec is None else spec
        keys = sorted(str(key) for key in entries.keys(True, True))
        raise SpaceError(
            f"--model {model_name(model)} reads one observation tensor (the entry 'observation'); {SpaceError.ENV}'s "
            f"observation is a dict ({', '.join(keys)}): flatten it into one tensor in the environment"
        )
    return spec


def _rounded(bound: torch.Tensor) -> list[float]:
    return [round(value, 4) for value in bound.tolist()]
