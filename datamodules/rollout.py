"""On-policy data path: collector → rollout → advantages → shuffled minibatches for K epochs → next rollout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from checkpoints.files import from_plain, to_plain
from datamodules.base import RLDataModule, check_positive
from datamodules.memory import MemoryNeed, transition_bytes


class RolloutDataModule(RLDataModule):
    """Collects ``num_envs * collect_steps`` frames with the current policy, then serves minibatches of them.

    The model's ``postprocess`` (GAE for PPO) runs on each rollout right after collection, before any update, so
    advantages are computed with the critic that collected the data. The next rollout is collected only when the
    model asks for the batch after the last minibatch of the last epoch — never ahead of the weights.

    A recurrent policy trains on sequences instead of single transitions: with ``bptt`` set, each environment's (and
    each agent's) ``collect_steps`` are cut into segments of ``bptt`` consecutive steps, and minibatches are whole
    segments, shaped ``[minibatch_size // bptt, bptt]``. Each segment keeps the recurrent state stored at its first
    step, so truncated back-propagation through time starts from the state the policy acted with.

    Args:
        env: environment factory (see :class:`RLDataModule`).
        minibatch_size: transitions (agent steps) per update; must divide the rollout's frames
            (``num_envs * collect_steps``, times the agents per environment).
        update_epochs: passes over each rollout.
        bptt: segment length for recurrent policies (0: shuffle single transitions); must divide ``collect_steps``
            and ``minibatch_size``.
        **kwargs: the base options (``num_envs``, ``collect_steps`` = rollout length per env, ``device``, ...).
    """

    def __init__(
        self,
        env: Callable[..., EnvBase],
        minibatch_size: int = 1024,
        update_epochs: int = 4,
        bptt: int = 0,
        num_envs: int = 256,
        collect_steps: int = 32,
        **kwargs: Any,
    ) -> None:
        super().__init__(env, num_envs=num_envs, collect_steps=collect_steps, **kwargs)
        check_positive("minibatch_size", minibatch_size)
        check_positive("update_epochs", update_epochs)
        check_positive("bptt", bptt, allow_zero=True)
        frames = num_envs * self.agents_per_env * collect_steps
        agents = f" * {self.agents_per_env} agents" if self.agents_per_env > 1 else ""
        if minibatch_size > frames:
            raise ValueError(
                f"data.minibatch_size ({minibatch_size}) is larger than a rollout: num_envs * "
                f"collect_steps{agents} = {frames} frames"
            )
        if frames % minibatch_size:
            raise ValueError(
                f"data.minibatch_size ({minibatch_size}) must divide the rollout: num_envs * "
                f"collect_steps{agents} = {frames} frames"
            )
        if bptt and (collect_steps % bptt or minibatch_size % bptt):
            raise ValueError(
                f"data.bptt ({bptt}) must divide collect_steps ({collect_steps}) and minibatch_size "
                f"({minibatch_size}): minibatches are whole segments of bptt steps"
            )
        self.minibatch_size = minibatch_size
        self.update_epochs = update_epochs
        self.bptt = bptt
        self.minibatches_per_rollout = update_epochs * frames // minibatch_size
        self.rollout: TensorDictBase | None = None  # the current rollout: [frames], or [segments, bptt] (_units)
        self.order: torch.Tensor | None = None  # row order for this rollout's minibatches, all epochs concatenated
        self.cursor = 0  # minibatches already served from this rollout
        # The current epoch's minibatches, cut from one gather of the rollout in that epoch's order: one indexing pass
        # per entry an epoch, not one per minibatch (a small update's per-minibatch indexing cost a few % of a PPO
        # run). Made from ``rollout`` and ``order`` when first needed, so it is not part of the state.
        self._epoch: tuple[int, tuple[TensorDictBase, ...]] | None = None

    def memory_needs(self, device: torch.device) -> list[MemoryNeed]:
        """The rollout kept for its epochs (one observation per step, the action, the reward, the flags and the
        advantage, value target, log-probability and value) and the base's (the collector's batch)."""
        per_frame = transition_bytes(self.observation_spec, self.action_spec, observations=1) + 4 * 4
        flag = f"data.num_envs {self.num_envs} x data.collect_steps {self.collect_steps}"
        rollout = MemoryNeed("the rollout", flag, self.frames_per_batch * per_frame, device)
        needs = [rollout, *super().memory_needs(device)]
        if self.minibatches_per_rollout > self.update_epochs:  # an epoch's rows in their shuffled order, beside it
            needs.append(MemoryNeed("an epoch's shuffled rollout", flag, self.frames_per_batch * per_frame, device))
        return needs

    @property
    def updates_per_rollout(self) -> int:
        return self.minibatches_per_rollout

    @property
    def batches_ready(self) -> int:
        # The rest of the current rollout's minibatches: the model's step takes them without Lightning's per-step work
        # (collection happens only when the next rollout is due, through the training stream).
        return self.minibatches_per_rollout - self.cursor if self.rollout is not None else 0

    def next_ready_batch(self) -> TensorDictBase:
        """The next minibatch of the current rollout (``batches_ready`` > 0)."""
        with self.timer.phase("sample"):
            per_minibatch = self.minibatch_size // max(self.bptt, 1)
            rows = self.rollout.shape[0]
            if per_minibatch == rows:  # the whole rollout: its rows in any order give the same loss
                minibatch = self.rollout.copy()
            else:
                epoch, index = divmod(self.cursor * per_minibatch, rows)
                if self._epoch is None or self._epoch[0] != epoch:
                    self._epoch = None  # the last epoch's rows go before this one's are gathered
                    shuffled = self.rollout[self.order[epoch * rows : (epoch + 1) * rows]]
                    self._epoch = (epoch, shuffled.split(per_minibatch))
                minibatch = self._epoch[1][index // per_minibatch]
        self.cursor += 1
        self.samples += minibatch.numel()
        return minibatch

    def next_batch(self) -> TensorDictBase:
        if self.rollout is None or self.cursor == self.minibatches_per_rollout:
            self.rollout, self._epoch = self._units(self.collect()), None
            with self.timer.phase("sample"):
                n = self.rollout.shape[0]
                device = self.rollout.device
                self.order = torch.cat([torch.randperm(n, device=device) for _ in range(self.update_epochs)])
            self.cursor = 0
        return self.next_ready_batch()

    def _units(self, rollout: TensorDictBase) -> TensorDictBase:
        """The rollout ``[*envs, collect_steps]`` as what minibatches draw from: ``[frames]`` transitions, or
        ``[segments, bptt]`` sequences. Only the entries the update reads are kept (the next observations, twice the
        size of everything else together on image-like observations, are not)."""
        if self.batch_keys is not None:
            rollout = rollout.select(*self.batch_keys, strict=False)
        rollout = rollout.exclude("collector")
        if not self.bptt:
            return rollout.reshape(-1)
        steps = rollout.shape[-1]
        return rollout.reshape(-1, steps // self.bptt, self.bptt).reshape(-1, self.bptt)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(rollout=to_plain(self.rollout), order=self.order, cursor=self.cursor)
        return state

    def _load_state(self, state_dict: dict[str, Any]) -> None:
        self.rollout = from_plain(state_dict["rollout"], batch_dims=2 if self.bptt else 1, device=self.device)
        self.order = state_dict["order"]
        self.cursor = state_dict["cursor"]
        self._epoch = None
        super()._load_state(state_dict)
