"""On-policy data path: collector → rollout → advantages → shuffled minibatches for K epochs → next rollout."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from datamodules.base import RLDataModule, check_positive, from_plain, to_plain


class RolloutDataModule(RLDataModule):
    """Collects ``num_envs * collect_steps`` frames with the current policy, then serves minibatches of them.

    The model's ``postprocess`` (GAE for PPO) runs on each rollout right after collection, before any update, so
    advantages are computed with the critic that collected the data. The next rollout is collected only when the
    model asks for the batch after the last minibatch of the last epoch — never ahead of the weights.

    Args:
        env: environment factory (see :class:`RLDataModule`).
        minibatch_size: transitions per update; must divide ``num_envs * collect_steps``.
        update_epochs: passes over each rollout.
        **kwargs: the base options (``num_envs``, ``collect_steps`` = rollout length per env, ``device``, ...).
    """

    def __init__(
        self,
        env: Callable[..., EnvBase],
        minibatch_size: int = 1024,
        update_epochs: int = 4,
        num_envs: int = 256,
        collect_steps: int = 32,
        **kwargs: Any,
    ) -> None:
        super().__init__(env, num_envs=num_envs, collect_steps=collect_steps, **kwargs)
        check_positive("minibatch_size", minibatch_size)
        check_positive("update_epochs", update_epochs)
        frames = num_envs * collect_steps
        if frames % minibatch_size:
            raise ValueError(
                f"--data.init_args.minibatch_size ({minibatch_size}) must divide num_envs * collect_steps ({frames})"
            )
        self.minibatch_size = minibatch_size
        self.update_epochs = update_epochs
        self.minibatches_per_rollout = update_epochs * frames // minibatch_size
        self.rollout: TensorDictBase | None = None  # the current rollout, flattened to [frames]
        self.order: torch.Tensor | None = None  # row order for this rollout's minibatches, all epochs concatenated
        self.cursor = 0  # minibatches already served from this rollout

    def _batches(self) -> Iterator[TensorDictBase]:
        while True:
            if self.rollout is None or self.cursor == self.minibatches_per_rollout:
                self.rollout = self.collect().exclude("collector").reshape(-1)
                with self.timer.phase("sample"):
                    n = self.rollout.numel()
                    device = self.rollout.device
                    self.order = torch.cat([torch.randperm(n, device=device) for _ in range(self.update_epochs)])
                self.cursor = 0
            with self.timer.phase("sample"):
                start = self.cursor * self.minibatch_size
                minibatch = self.rollout[self.order[start : start + self.minibatch_size]]
            self.cursor += 1
            self.samples += minibatch.numel()
            yield minibatch

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(rollout=to_plain(self.rollout), order=self.order, cursor=self.cursor)
        return state

    def _load_state(self, state_dict: dict[str, Any]) -> None:
        self.rollout = from_plain(state_dict["rollout"], batch_dims=1, device=self.device)
        self.order = state_dict["order"]
        self.cursor = state_dict["cursor"]
        super()._load_state(state_dict)
