"""Cue recall: a tiny multi-agent memory task in MettaGrid's token format, for fast tests of recurrent agents.

Each agent sees a cue (one of ``num_actions`` values) on the first step of an episode only; afterwards its
observation shows the step count and nothing else. On the last step of the ``length``-step episode, the agent earns
1 if its action names the cue, 0 otherwise; no other step gives reward. A policy without memory gets
``1 / num_actions`` per episode on average; one that carries the cue in its recurrent state gets 1. So the task tells
apart, in seconds, a recurrent agent whose state is carried, reset at episode starts and trained through time from
one whose state is lost anywhere along the way.

Observations are MettaGrid-style tokens ``[num_tokens, 3]`` uint8, ``[packed y<<4|x, feature, value]`` with 0xFF
padding, in an 11×11 view (the smallest the reference's convolutions accept, docs/reference_systems.md §5): feature 0 is
the cue (at the centre cell, value cue + 1, first step only), feature 1 the step count (top-left cell). Batch
``[num_envs, num_agents]``; all agents of an environment start and end together. Randomness is counter-based
(``counter_rng``), so a batch of N environments plays the episodes of N single environments seeded
``seed … seed + N − 1``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from envs.base import BatchedEnv
from envs.counter_rng import random_bits
from envs.tokens import ObservationLayout

_VIEW = 11
_CENTRE = (_VIEW // 2) << 4 | (_VIEW // 2)


class CueRecallEnv(BatchedEnv):
    """Batched cue-recall episodes.

    Args:
        num_envs: environments stepped together.
        num_agents: agents per environment.
        num_actions: cues, and actions to answer with.
        length: steps per episode (>= 2: the cue is never shown on the step that is rewarded).
        seed: base seed; environment ``i`` draws from stream ``seed + i``.
        device: where the batch lives.
    """

    def __init__(
        self,
        num_envs: int = 1,
        num_agents: int = 2,
        num_actions: int = 2,
        length: int = 8,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        if num_agents < 1:
            raise ValueError(f"num_agents must be > 0, got {num_agents}")
        if not 2 <= num_actions <= 254:
            raise ValueError(f"num_actions must be in [2, 254], got {num_actions}")
        if not 2 <= length <= 255:
            raise ValueError(f"length must be in [2, 255], got {length}")
        super().__init__(batch_size=torch.Size([num_envs, num_agents]), device=device)
        self.num_actions, self.length = num_actions, length
        dev, batch = self.device, self.batch_size
        self.register_buffer("cue", torch.zeros(batch, dtype=torch.long, device=dev))
        self.register_buffer("steps", torch.zeros(num_envs, dtype=torch.long, device=dev))
        self.register_buffer("stream", torch.arange(num_envs, dtype=torch.long, device=dev) + seed)
        self.register_buffer("draws", torch.zeros(num_envs, dtype=torch.long, device=dev))
        #: how the tokens decode into a grid (read by RecurrentPPO): per-feature value scale and the view's size.
        self.observation_layout = ObservationLayout(
            height=_VIEW, width=_VIEW, feature_names=("cue", "step"), normalization=(num_actions, length)
        )
        self.observation_spec = Composite(
            observation=Bounded(0, 255, shape=(*batch, 2, 3), dtype=torch.uint8, device=dev), shape=batch, device=dev
        )
        self.action_spec = Categorical(num_actions, shape=batch, device=dev)
        self.reward_spec = Unbounded(shape=(*batch, 1), device=dev)

    def _set_seed(self, seed: int | None) -> None:
        seed = 0 if seed is None else seed
        self.stream.copy_(torch.arange(self.batch_size[0], device=self.device) + seed)
        self.draws.zero_()

    def _observation(self) -> torch.Tensor:
        tokens = torch.full((*self.batch_size, 2, 3), 255, dtype=torch.uint8, device=self.device)
        first = (self.steps == 0).unsqueeze(1)
        cue_token = torch.stack([torch.full_like(self.cue, _CENTRE), torch.zeros_like(self.cue), self.cue + 1], -1)
        tokens[:, :, 0] = torch.where(first.unsqueeze(-1), cue_token, 255).to(torch.uint8)
        tokens[:, :, 1, 0], tokens[:, :, 1, 1] = 0, 1
        tokens[:, :, 1, 2] = self.steps.unsqueeze(1).to(torch.uint8)
        return tokens

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        reset = None if tensordict is None else tensordict.get("_reset", None)
        # An environment restarts when any of its agents is flagged: its agents always end together.
        mask = torch.ones_like(self.steps, dtype=torch.bool) if reset is None else reset.flatten(1).any(1)
        cues = random_bits(self.stream, self.draws, self.batch_size[1]) % self.num_actions
        self.cue.copy_(torch.where(mask.unsqueeze(1), cues, self.cue))
        self.draws.add_(mask)
        self.steps.masked_fill_(mask, 0)
        false = torch.zeros(*self.batch_size, 1, dtype=torch.bool, device=self.device)
        return TensorDict(
            {
                "observation": self._observation(),
                "done": false,
                "terminated": false.clone(),
                "truncated": false.clone(),
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        last = (self.steps == self.length - 1).unsqueeze(1)
        reward = (last & (tensordict["action"] == self.cue)).float().unsqueeze(-1)
        self.steps.add_(1)
        done = last.expand(self.batch_size).unsqueeze(-1)
        return TensorDict(
            {
                "observation": self._observation(),
                "reward": reward,
                "done": done.clone(),
                "terminated": done.clone(),
                "truncated": torch.zeros_like(done),
            },
            batch_size=self.batch_size,
            device=self.device,
        )
