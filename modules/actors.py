"""TorchRL ``ProbabilisticActor`` policies that act without building the distribution object.

A collection calls its policy once per step. For a small network, TorchRL's probabilistic path (the distribution's
construction, its sampling through the TensorDict plumbing, each wrapped module's own call machinery) costs several
times the network's forward (docs/history/gymnasium.md, "Against Stable-Baselines3: the full table of 10:51–18:32").
These actors keep the ``ProbabilisticActor`` (its modules, keys and spec, what the loss and checkpoints see) and compute
the same action and log-probability as its forward from the same random draws, written out: :class:`CategoricalActor`
for a ``Categorical``, :class:`NormalActor` for TorchRL's ``IndependentNormal``, :class:`TanhNormalActor` for its
``TanhNormal`` (SAC's actor). Under an interaction type they do not handle, or with an output TensorDict, they are
``ProbabilisticActor.forward``, which is also their specification (tests/agents/test_actors.py).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torchrl.data import TensorSpec
from torchrl.envs.utils import ExplorationType, exploration_type, set_exploration_type
from torchrl.modules import ProbabilisticActor, TanhNormal
from torchrl.modules.distributions import IndependentNormal

from modules.networks import PlainForward

#: The interaction types the actors here compute themselves.
HANDLED = (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC, ExplorationType.MODE)


class DirectActor(ProbabilisticActor):
    """A ``ProbabilisticActor`` whose forward writes the distribution's parameters, then :meth:`act`'s action and
    log-probability (with ``return_log_prob``). Modules that are plain ``TensorDictModule``s (a network on its
    inputs, directly or in a ``TensorDictSequential``) are called as their networks."""

    #: The interaction types :meth:`act` computes; under others the actor is ``ProbabilisticActor.forward``.
    handled = HANDLED

    def __init__(self, module: TensorDictModuleBase, return_log_prob: bool = True, **kwargs: Any) -> None:
        super().__init__(module, return_log_prob=return_log_prob, **kwargs)
        self._writes_log_prob = return_log_prob
        sampler = self.module[-1]
        self._parameter_keys = list(sampler.in_keys)
        self._action_key, self._log_prob_key = sampler.dist_sample_keys[0], sampler.log_prob_key
        self._default_interaction = sampler.default_interaction_type
        writers = flattened(list(self.module[:-1]))
        # Kept as a plain list (the modules are registered where they are): None when any is not a plain module. Each
        # writer's network is called layer by layer where it can be (PlainForward: the same operations, without the
        # modules' call machinery, a noticeable share of a small network's acting call).
        plain = all(type(writer) is TensorDictModule for writer in writers)
        self._plain_writers = (
            [(writer, PlainForward.of(writer.module) or writer.module) for writer in writers] if plain else None
        )

    def act(
        self, parameters: list[torch.Tensor], sample: bool, log_prob: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The action (a sample, or the deterministic action) and its log-probability (None without ``log_prob``),
        from the distribution's parameters (the sampler's ``in_keys``, in order). Each subclass writes out its own
        distribution's."""
        raise NotImplementedError(f"{type(self).__name__} must define act() for its distribution")

    def without_log_prob(self) -> DirectActor:
        """This actor writing the distribution's parameters and the action, not the log-probability: for a caller that
        reads only the action (an evaluation, a video), whose deterministic action then costs no normalisation of the
        distribution. It shares this actor's modules (a shallow copy: it acts with the weights as they are when it
        acts); under an interaction type :meth:`act` does not handle it is ``ProbabilisticActor.forward``, as this
        actor is."""
        actor = copy.copy(self)
        actor._writes_log_prob = False
        return actor

    def forward(
        self, tensordict: TensorDictBase, tensordict_out: TensorDictBase | None = None, **kwargs: Any
    ) -> TensorDictBase:
        mode = exploration_type() or self._default_interaction
        if tensordict_out is not None or kwargs or mode not in self.handled:
            return super().forward(tensordict, tensordict_out, **kwargs)
        if self._plain_writers is not None:
            for writer, network in self._plain_writers:
                outputs = network(*(tensordict.get(key) for key in writer.in_keys))
                if len(writer.out_keys) == 1:
                    outputs = (outputs,)
                for key, value in zip(writer.out_keys, outputs, strict=True):
                    tensordict.set(key, value)
        else:
            with set_exploration_type(mode):  # as ProbabilisticActor runs what writes the parameters
                for writer in self.module[:-1]:
                    tensordict = writer(tensordict)
        parameters = [tensordict.get(key) for key in self._parameter_keys]
        action, log_prob = self.act(parameters, mode is ExplorationType.RANDOM, self._writes_log_prob)
        tensordict.set(self._action_key, action)
        if self._writes_log_prob:
            tensordict.set(self._log_prob_key, log_prob)
        return tensordict


def flattened(modules: list[TensorDictModuleBase]) -> list[TensorDictModuleBase]:
    """The modules of ``TensorDictSequential``s in ``modules``, in the order they run."""
    out = []
    for module in modules:
        out.extend(flattened(list(module.module)) if type(module) is TensorDictSequential else [module])
    return out


class CategoricalActor(DirectActor):
    """A policy sampling discrete actions from the ``logits`` its module writes, recording each action's
    log-probability: under ``RANDOM`` as ``Categorical.sample`` does (``torch.multinomial`` of the same
    probabilities), under ``DETERMINISTIC`` and ``MODE`` ``Categorical.mode`` (without the log-probability, the
    logits' argmax: the same action but where rounding makes two probabilities equal)."""

    def __init__(self, logits: TensorDictModuleBase, action_spec: TensorSpec) -> None:
        super().__init__(
            logits, in_keys=["logits"], spec=action_spec, distribution_class=torch.distributions.Categorical
        )

    def act(
        self, parameters: list[torch.Tensor], sample: bool, log_prob: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        (logits,) = parameters
        if not sample and not log_prob:
            return logits.argmax(-1), None
        log_probs = logits - logits.logsumexp(-1, keepdim=True)  # Categorical's normalised logits ...
        probs = log_probs.softmax(-1)  # ... and its probabilities
        if sample:
            action = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).reshape(probs.shape[:-1])
        else:
            action = probs.argmax(-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)


class NormalActor(DirectActor):
    """A policy sampling Box actions from TorchRL's ``IndependentNormal`` of the ``loc`` and ``scale`` its module
    writes, recording each action's log-density: under ``RANDOM`` its ``rsample`` (``loc + ε·scale``, ε drawn as
    ``torch.distributions.Normal`` draws it), under ``DETERMINISTIC`` and ``MODE`` its mean."""

    def __init__(self, module: TensorDictModuleBase, action_spec: TensorSpec) -> None:
        super().__init__(module, in_keys=["loc", "scale"], spec=action_spec, distribution_class=IndependentNormal)

    def act(
        self, parameters: list[torch.Tensor], sample: bool, log_prob: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        loc, scale = torch.broadcast_tensors(*parameters)
        action = loc + torch.empty_like(loc).normal_() * scale if sample else loc
        if not log_prob:
            return action, None
        # Normal.log_prob, summed over the action's dimensions as Independent sums it.
        log_density = -((action - loc) ** 2) / (2 * scale**2) - scale.log() - math.log(math.sqrt(2 * math.pi))
        return action, log_density.sum(-1)


class TanhNormalActor(DirectActor):
    """A policy sampling Box actions from TorchRL's ``TanhNormal`` of the ``loc`` and ``scale`` its module writes:
    under ``RANDOM`` its ``rsample``, ``centre + half_range · tanh(loc + ε·scale)`` (ε drawn as
    ``torch.distributions.Normal`` draws it; the affine step only where the box is not [−1, 1], as ``TanhNormal``
    composes it), under ``DETERMINISTIC`` its deterministic sample, the same with ε = 0. It records no
    log-probability: SAC's collection needs none (its loss draws its own actions). ``TanhNormal`` has no mode: under
    ``MODE`` it is ``ProbabilisticActor.forward``, whose error says so."""

    handled = (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC)

    def __init__(
        self,
        module: TensorDictModuleBase,
        action_spec: TensorSpec,
        low: torch.Tensor,
        high: torch.Tensor,
        **kwargs: Any,
    ) -> None:
        distribution_kwargs = {"low": low, "high": high, **kwargs.pop("distribution_kwargs", {})}
        super().__init__(
            module,
            return_log_prob=False,
            in_keys=["loc", "scale"],
            spec=action_spec,
            distribution_class=TanhNormal,
            distribution_kwargs=distribution_kwargs,
            **kwargs,
        )
        # Not buffers: the actor's parameters and buffers are what SACLoss and checkpoints hold. The box's centre and
        # half-range as TanhNormal's affine step computes them, kept per device and dtype.
        self._bounds = (low, high)
        self._affine = bool((high != 1.0).any() or (low != -1.0).any())
        self._box: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def act(self, parameters: list[torch.Tensor], sample: bool, log_prob: bool = False) -> tuple[torch.Tensor, None]:
        loc, scale = torch.broadcast_tensors(*parameters)
        pre_tanh = loc + torch.empty_like(loc).normal_() * scale if sample else loc
        action = pre_tanh.tanh()
        if self._affine:
            key = (action.device, action.dtype)
            if key not in self._box:
                low, high = (bound.to(action) for bound in self._bounds)
                self._box[key] = ((high + low) / 2, (high - low) / 2)
            centre, half_range = self._box[key]
            action = centre + half_range * action
        return action, None
