"""What acting adds to an actor's action in the collector: exploration.

These modules run wherever the acting policy runs, in collector worker processes too, so this file imports no
Lightning (nor an agent's file, which does): a worker that unpickles its policy imports only what the policy is made of
(tests/app/test_layout.py). The agents that use them: :class:`~modules.dqn.DQN` (and its subclasses) and
:class:`~modules.td3.TD3`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Categorical, TensorSpec
from torchrl.envs.utils import ExplorationType, exploration_type
from torchrl.modules import EGreedyModule, QValueActor, QValueModule

from compat.tensordict import set_unchecked
from compat.torch import own_buffers
from modules.networks import PlainForward


class GreedyRowsEGreedy(TensorDictModuleBase):
    """ε-greedy acting that runs the Q-network only for the rows that act greedily.

    TorchRL's ``EGreedyModule`` replaces the actions an actor already chose, so the network runs on every row even
    when ε is near 1 — as it is for all of the Mario reference's first 500k annealing frames, where the forward pass of
    its CNN is a noticeable share of a collector worker's time (docs/results/mario.md, "ε-greedy that skips the
    network"). This draws what ``EGreedyModule`` draws, in its order (which rows explore, then a random action for
    every row: the same actions for the same generator), and then evaluates the actor on the greedy rows alone; it
    writes ``action`` only, since the rows that explore have no Q-values.

    On an accelerator the whole batch costs what a few rows do and choosing rows would wait for the device, so there
    (and under a deterministic exploration type, where nothing explores) it is ``EGreedyModule`` after the actor.
    """

    def __init__(self, actor: TensorDictModuleBase, egreedy: EGreedyModule) -> None:
        super().__init__()
        self.actor, self.egreedy = actor, egreedy
        self.in_keys, self.out_keys = list(actor.in_keys), [egreedy.action_key]
        # The random actions' spec, expanded to each batch shape once (an expansion builds a spec object per call).
        self._random_actions: dict[torch.Size, Any] = {}
        # A QValueActor of a plain network and index actions: its greedy action is the argmax of the network's
        # Q-values (QValueModule's "categorical" action), computed here on the tensor without its tensordict passes.
        self._q_network = categorical_q_network(actor)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        eps = own_buffers(self.egreedy)["eps"]  # not egreedy.eps: nn.Module.__getattr__'s slow road, twice
        device, shape = eps.device, tensordict.shape
        if device.type != "cpu" or exploration_type() not in (ExplorationType.RANDOM, None):
            return self.egreedy(self.actor(tensordict))
        draw = torch.rand(shape, device=device)
        random = self._random_actions.get(shape)
        if random is None:
            random = self._random_actions[shape] = random_actions(
                self.egreedy.spec[self.egreedy.action_key].expand(shape)
            )
        action = random()
        if shape.numel() == 1:
            # One row (a one-copy loop, once a frame): the draw and ε read and compared on the host (the same float32
            # numbers, compared exactly), where the tensors' road takes a comparison and a reduction.
            if draw.item() >= eps.item():
                action = self._greedy(tensordict, None)
        elif not (explore := draw < eps).any():  # all greedy (most steps once ε is small): no rows to select
            action = self._greedy(tensordict, None)
        elif not explore.all():
            greedy = ~explore
            action[greedy] = self._greedy(tensordict, greedy)
        key, device = self.egreedy.action_key, tensordict.device
        # The action has the tensordict's rows; its device is checked here, its key must be a string: set's own checks
        # are spared on the one-copy loops, which act once a frame.
        if type(tensordict) is TensorDict and isinstance(key, str) and (device is None or device == action.device):
            set_unchecked(tensordict, key, action)
        else:
            tensordict.set(key, action)
        return tensordict

    def _greedy(self, tensordict: TensorDictBase, rows: torch.Tensor | None) -> torch.Tensor:
        """The actor's action on ``rows`` of ``tensordict`` (all of them with None)."""
        if self._q_network is not None:
            network, key = self._q_network
            observation = tensordict.get(key)
            return network(observation if rows is None else observation[rows]).argmax(-1)
        inputs = tensordict.select(*self.in_keys)
        return self.actor(inputs if rows is None else inputs[rows]).get(self.egreedy.action_key)


def random_actions(spec: TensorSpec) -> Callable[[], torch.Tensor]:
    """What draws ``spec.rand()``: for index actions without a mask, the same ``torch.randint`` call it makes (the same
    numbers from the same generator) without its per-call shape and cardinality checks, once a frame on a one-copy
    loop; any other spec's own ``rand``."""
    if type(spec) is Categorical and spec.mask is None and spec.space.n > 0:
        n, shape, device, dtype = spec.space.n, spec.shape, spec.device, spec.dtype
        return lambda: torch.randint(0, n, shape, device=device, dtype=dtype)
    return spec.rand


def categorical_q_network(actor: TensorDictModuleBase) -> tuple[nn.Module, NestedKey] | None:
    """``(network, observation key)`` of a ``QValueActor`` that runs one plain network on one entry and takes index
    actions without a mask (its greedy action is then ``network(observation).argmax(-1)``, as ``QValueModule``
    computes it); None for any other actor."""
    if not isinstance(actor, QValueActor) or len(actor.module) != 2:
        return None
    values, chooser = actor.module
    plain = type(values) is TensorDictModule and len(values.in_keys) == 1
    if not plain or not isinstance(chooser, QValueModule):
        return None
    if chooser.action_space != "categorical" or chooser.action_mask_key is not None:
        return None
    return PlainForward.of(values.module) or values.module, values.in_keys[0]


class BoxExploration(TensorDictModuleBase):
    """The acting policy's exploration on the actor's ``action``: Gaussian noise of ``scale`` (in the action's units)
    added and the sum clipped to the box, or, while ``uniform`` is set (the warm-up before the first update), an action
    drawn uniformly from the box instead. Under a deterministic exploration type (evaluation) the action is left as it
    is. ``uniform`` is a tensor, so that choosing between the two reads nothing back to the host."""

    def __init__(self, low: torch.Tensor, high: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.in_keys, self.out_keys = ["action"], ["action"]
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.register_buffer("scale", scale)
        # Not saved: set from the update counter when a fit starts (TD3.on_fit_start), cleared at the first update.
        self.register_buffer("uniform", torch.tensor(False), persistent=False)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if exploration_type() not in (ExplorationType.RANDOM, None):
            return tensordict
        action = tensordict.get("action")
        noisy = torch.minimum(torch.maximum(action + self.scale * torch.randn_like(action), self.low), self.high)
        uniform = self.low + (self.high - self.low) * torch.rand_like(action)
        tensordict.set("action", torch.where(self.uniform, uniform, noisy))
        return tensordict
