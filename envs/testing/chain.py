"""A tiny batched chain world for fast tests of the data paths and agents (not a benchmark).

Each environment is a walker on cells ``0 … length-1`` starting at cell 0. Action 1 steps right, action 0 steps
left (clamped at 0). Reaching the last cell gives +1 and terminates; every other step gives 0; episodes are
truncated after ``max_steps`` steps. The optimal return is 1 in ``length - 1`` steps, so learning is visible within
a few hundred updates. The observation is the one-hot position (uint8, like Snake's planes).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Binary, Categorical, Composite, Unbounded

from envs.base import BatchedEnv


class ChainEnv(BatchedEnv):
    """Batched chain walk; all state lives in registered buffers, so ``state_dict`` captures it.

    Args:
        num_envs: environments in the batch.
        length: cells in the chain (>= 2).
        max_steps: truncation limit per episode.
        seed: unused (the chain is deterministic); accepted so every env shares one factory signature.
        device: where the batch lives.
    """

    def __init__(
        self,
        num_envs: int = 1,
        length: int = 5,
        max_steps: int = 20,
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        if length < 2:
            raise ValueError(f"length must be >= 2, got {length}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be > 0, got {max_steps}")
        super().__init__(batch_size=torch.Size([num_envs]), device=device)
        self.length, self.max_steps = length, max_steps
        self.register_buffer("position", torch.zeros(num_envs, dtype=torch.long, device=self.device))
        self.register_buffer("steps", torch.zeros(num_envs, dtype=torch.long, device=self.device))
        batch = (num_envs,)
        self.observation_spec = Composite(
            observation=Binary(n=length, shape=(*batch, length), dtype=torch.uint8, device=self.device),
            shape=batch,
            device=self.device,
        )
        self.action_spec = Categorical(2, shape=batch, device=self.device)
        self.reward_spec = Unbounded(shape=(*batch, 1), device=self.device)

    def _observation(self) -> torch.Tensor:
        return torch.nn.functional.one_hot(self.position, self.length).to(torch.uint8)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        mask = torch.ones_like(self.position, dtype=torch.bool) if mask is None else mask.reshape(-1)
        self.position.masked_fill_(mask, 0)
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
        move = tensordict["action"].reshape(-1) * 2 - 1
        self.position.copy_((self.position + move).clamp(0, self.length - 1))
        self.steps.add_(1)
        terminated = (self.position == self.length - 1).unsqueeze(-1)
        truncated = (self.steps >= self.max_steps).unsqueeze(-1) & ~terminated
        return TensorDict(
            {
                "observation": self._observation(),
                "reward": terminated.float(),
                "done": terminated | truncated,
                "terminated": terminated,
                "truncated": truncated,
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    def _set_seed(self, seed: int | None) -> None:
        return None
