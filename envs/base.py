"""The batched-environment contract every environment here follows, and :class:`BatchedEnv`, which gives most of it.

An environment is a TorchRL ``EnvBase`` that steps a whole batch of environments at once, built as
``Env(num_envs=..., seed=..., device=..., **options)``:

- **Constructor.** ``__init__(self, num_envs=1, <options, each with a default>, seed=0, device="cpu")``. The batch is
  ``[num_envs]``, or ``[num_envs, num_agents]`` when several agents share one policy. Options are keyword arguments
  a YAML config can hold; a bad one raises ``ValueError`` starting with the option's name (``size must be >= 3, got
  2``), and the command line puts the flag in front of it. :class:`BatchedEnv` records the options a constructor was
  called with: :meth:`BatchedEnv.init_kwargs` returns them, and ``type(env)(num_envs=n, seed=s, device=d,
  **env.init_kwargs())`` builds the same environment again (in a worker process, for evaluation, for Monte Carlo).
- **Specs.** The constructor sets the observation, action and reward specs; the done spec (``done``, ``terminated``,
  ``truncated``, bool ``[*batch, 1]``) is :class:`BatchedEnv`'s. ``_reset`` and ``_step`` return every entry of the
  specs.
- **Seeding.** The same seed and the same actions play the same episodes. The environments here draw from
  counter-based streams (:mod:`envs.counter_rng`), so environment ``i`` of a batch seeded ``seed`` plays
  what a single environment seeded ``seed + i`` plays.
- **State.** Everything the continuation depends on is in ``state_dict()`` (registered buffers, or
  ``get_extra_state`` for an engine that cannot be read out): loaded into a new environment of the same options, it
  continues exactly. Checkpoints and worker processes rely on it. An environment that cannot (an engine with neither
  a snapshot nor a deterministic replay: any Gymnasium id) declares ``exact_state = False`` and says why in
  ``inexact_state_reason``: its state holds what can be restored (seed streams, episode counters), loading it ends
  the running episodes, and its next reset starts the following ones; the collection then carries that reset's
  output rather than the checkpoint's observations (``datamodules/collection.py``).
- **Declarations**, class attributes with defaults here: ``episode_metric_keys`` (per-step entries an evaluation sums
  over each episode and reports), ``episode_metric_over`` (metrics averaged only over the episodes where another is
  positive), ``physics`` (the dynamics a physics-informed loss differentiates) and ``observation_layout`` (how token
  observations decode into a grid). :meth:`BatchedEnv.declaration` gathers them, with the class and options that
  rebuild the environment, into one typed :class:`EnvDeclaration`: the only way the rest of the project learns about
  an environment (the data module reads it once from a throw-away environment, as ``datamodule.declared``).
- **Rendering** (optional): an environment that can be drawn sets ``can_render = True`` and implements
  :meth:`BatchedEnv.render`, environment ``index`` of the batch as an RGB image (uint8 ``[height, width, 3]``, the
  same size at every call). Videos (``callbacks/video.py``, ``python -m app watch``) are made of these frames, drawn
  by an environment built with the class's ``render_options`` on top of the evaluation's (an environment that draws
  only when asked to at construction, as Gymnasium's do, names that option there).

``tests/envs/test_env_contract.py`` checks the contract for every environment in this package;
``docs/extending/environment.md`` ("Adding an environment") shows a complete one.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite
from torchrl.envs import EnvBase

from compat.torchrl import FastStepAndMaybeReset

if TYPE_CHECKING:
    from envs.tokens import ObservationLayout

#: Constructor arguments that say how many environments, from which seed and where, rather than which environment.
BATCH_ARGUMENTS = ("num_envs", "seed", "device")


class BatchedEnv(FastStepAndMaybeReset, EnvBase):
    """Base class of the batched environments: records the constructor's options, builds the done spec, and steps
    for a collector without TorchRL's per-key passes (:class:`~compat.torchrl.FastStepAndMaybeReset`).

    A subclass calls ``super().__init__(batch_size=torch.Size([num_envs]), device=device)``, then sets its
    observation, action and reward specs; it overrides the class attributes below that it has. One whose ``_step``
    and ``_reset`` are tensor arithmetic with fixed shapes offers the option ``compile_step`` (passed on here): the
    step and the masked reset of finished rows compiled into one graph each (the whole batch's first reset, which
    runs once, stays eager). Its step then skips work only where :attr:`skips_idle_work` holds.
    """

    #: per-step entries (``[*batch, 1]``, 0 except where an episode ends, so an episode's sum is its value) that the
    #: evaluation reports as ``<key>_mean``; each is also in the observation spec.
    episode_metric_keys: ClassVar[tuple[str, ...]] = ()
    #: ``{metric: marker}``: ``metric`` is averaged over the episodes whose ``marker`` sum is positive only.
    episode_metric_over: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: the dynamics a physics-informed loss uses (:mod:`envs.safety.physics`); None: none.
    physics: Any = None
    #: how token observations decode into a grid (:class:`~envs.tokens.ObservationLayout`).
    observation_layout: ObservationLayout | None = None
    #: whether :meth:`render` draws this environment (videos need it).
    can_render: ClassVar[bool] = False
    #: options of an environment built to be drawn (a video's): those that turn on what only drawing needs, which the
    #: environments of training and evaluation go without (Gymnasium's: ``render``).
    render_options: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    #: whether ``state_dict()`` continues the running episodes exactly; False: loading it ends them, and the next
    #: reset starts the following episodes (the module docstring), for the reason ``inexact_state_reason`` states.
    exact_state: ClassVar[bool] = True
    inexact_state_reason: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _recording_options(cls.__init__)

    def __init__(
        self, *, batch_size: torch.Size, device: str | torch.device, compile_step: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(batch_size=batch_size, device=device, **kwargs)
        batch, dev = self.batch_size, self.device
        flag = Categorical(2, shape=(*batch, 1), dtype=torch.bool, device=dev)
        self.done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=batch, device=dev)
        #: whether the step may read a mask back to the host to skip work no environment of the batch needs: free on
        #: a CPU, a synchronisation on a GPU, and a graph break for the compiler.
        self.skips_idle_work = self.device.type == "cpu" and not compile_step
        if compile_step:
            # Each a single graph (fullgraph: a graph break is an error, not a silent fallback), so that the step is a
            # few fused kernels and a CUDA graph can capture it. TorchRL's ``compile=`` compiles its own bookkeeping
            # around the step as well, which is not needed for this.
            self._step = torch.compile(self._step, fullgraph=True)
            eager_reset, masked_reset = self._reset, torch.compile(self._reset, fullgraph=True)

            def _reset(tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
                # Only the masked reset of finished rows runs every step; the whole batch's first reset runs once, and
                # compiling it would cost a compilation of its own (seconds) for nothing.
                if tensordict is None or "_reset" not in tensordict.keys():  # noqa: SIM118 (a TensorDict has no `in`)
                    return eager_reset(tensordict, **kwargs)
                return masked_reset(tensordict, **kwargs)

            self._reset = _reset

    def init_kwargs(self) -> dict[str, Any]:
        """The constructor's options (all but ``num_envs``, ``seed`` and ``device``), defaults included: what rebuilds
        this environment."""
        return copy.deepcopy(self._init_options)

    def declaration(self) -> EnvDeclaration:
        """What this environment tells the rest of the project about itself (:class:`EnvDeclaration`)."""
        return EnvDeclaration(
            env_class=type(self),
            options=self.init_kwargs(),
            episode_metric_keys=tuple(self.episode_metric_keys),
            episode_metric_over=dict(self.episode_metric_over),
            physics=self.physics,
            observation_layout=self.observation_layout,
            can_render=self.can_render,
            render_options=dict(self.render_options),
            exact_state=self.exact_state,
            inexact_state_reason=self.inexact_state_reason,
        )

    def render(self, index: int = 0) -> np.ndarray:
        """Environment ``index`` of the batch (the first batch dimension: all agents of a multi-agent environment) as
        it is now: an RGB image, uint8 ``[height, width, 3]``, the same size at every call. Environments that can be
        drawn set :attr:`can_render` and override this."""
        raise NotImplementedError(f"{cannot_render(type(self))}")

    def _render_index(self, index: int) -> int:
        """``index`` checked against the batch (a ``ValueError`` naming it otherwise)."""
        if not 0 <= index < self.batch_size[0]:
            raise ValueError(f"index must be in [0, {self.batch_size[0]}) (the batch's environments), got {index}")
        return index


class MaskedResets:
    """Mixin, before :class:`BatchedEnv` in an environment's bases, for an environment whose ``_reset`` resets the
    rows its ``_reset`` mask names and returns every row (the others as they are): ``maybe_reset`` then resets the
    finished rows without ``EnvBase``'s per-key masked merge, which would copy the whole batch for nothing, at a cost
    larger than the step's own on thousands of environments (docs/results/snake.md, "Snake: speed on the 2-core
    CPU")."""

    def maybe_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        done = tensordict.get("done")
        # Free on the CPU, and it skips most of a reset; a synchronisation on a GPU and a graph break in a compiled
        # step, where the masked reset runs every step and leaves the rows that are not done as they were.
        if self.skips_idle_work and not bool(done.any()):  # type: ignore[attr-defined]
            return tensordict
        reset = self._reset(TensorDict({"_reset": done}, batch_size=self.batch_size, device=self.device))  # type: ignore[attr-defined]
        # The episode metrics are per step: every row keeps the value of the step it just took, reset or not, so the
        # result does not depend on whether another row of the batch reset.
        tensordict.update(reset.exclude(*self.episode_metric_keys))  # type: ignore[attr-defined]
        return tensordict


@dataclass(frozen=True)
class EnvDeclaration:
    """What an environment tells the rest of the project, read once from a throw-away environment
    (:meth:`BatchedEnv.declaration`): how to build it again, and its declarations (the module docstring). Agents,
    callbacks and collection strategies ask this object, never the environment's family, so that shared code imports
    no family. Plain values (copies), so that it pickles into worker processes.

    Attributes:
        env_class: the environment's class.
        options: its constructor's options (all but ``num_envs``, ``seed`` and ``device``): with the class, what
            rebuilds it in a worker process or for an evaluation
            (``env_class(num_envs=..., seed=..., device=..., **options)``).
        episode_metric_keys: per-step entries summed over each episode and reported as ``<key>_mean``.
        episode_metric_over: ``{metric: marker}``: ``metric`` averaged over the episodes whose ``marker`` is positive.
        physics: the dynamics a physics-informed loss differentiates (PIRL's), or None.
        observation_layout: how token observations decode into a grid (:class:`~envs.tokens.ObservationLayout`), or
            None.
        can_render: whether ``render`` draws the environment (videos need it).
        render_options: options of an environment built to be drawn.
        exact_state: whether its state continues the running episodes exactly (``inexact_state_reason``: why not).
    """

    env_class: type[BatchedEnv]
    options: Mapping[str, Any]
    episode_metric_keys: tuple[str, ...] = ()
    episode_metric_over: Mapping[str, str] = field(default_factory=dict)
    physics: Any = None
    observation_layout: ObservationLayout | None = None
    can_render: bool = False
    render_options: Mapping[str, Any] = field(default_factory=dict)
    exact_state: bool = True
    inexact_state_reason: str = ""


def cannot_render(env_class: type) -> str:
    """Why an environment class makes no videos, in the words an error line uses."""
    name = f"{env_class.__module__}.{env_class.__qualname__}"
    return f"{name} cannot render (it has no render(); BatchedEnv.can_render is False), so it makes no video"


def _recording_options(init: Callable[..., None]) -> Callable[..., None]:
    """``init``, saving the options it was called with on the instance once it returns.

    A subclass's constructor calls its parent's: both record, the outermost last, so its options are the ones kept.
    """
    signature = inspect.signature(init)
    parameters = list(signature.parameters.values())[1:]
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        raise TypeError(f"{init.__qualname__}: an environment's options are named; it cannot take *args")
    keyword = [parameter.name for parameter in parameters if parameter.kind is inspect.Parameter.VAR_KEYWORD]

    @functools.wraps(init)
    def __init__(self: BatchedEnv, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        options = {parameter.name: bound.arguments[parameter.name] for parameter in parameters}
        for name in keyword:
            options.update(options.pop(name))
        for name in BATCH_ARGUMENTS:
            options.pop(name, None)
        self._init_options = copy.deepcopy(options)  # the caller's lists and dicts stay the caller's

    return __init__
