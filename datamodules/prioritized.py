"""Proportional prioritized replay in plain torch, as a TorchRL replay-buffer ``Sampler``.

Schaul et al., "Prioritized Experience Replay", ICLR 2016: transition ``i`` is drawn with probability
``P(i) = p_i^α / Σ_j p_j^α``, where ``p_i`` is its last absolute TD error (plus ``eps``) and a new transition gets the
largest priority seen so far, so it is replayed at least once soon; the loss weighs each draw by the importance weight
``w_i = (N · P(i))^−β / max_j (N · P(j))^−β = (p_i^α / min_j p_j^α)^−β``.

TorchRL's own ``PrioritizedSampler`` keeps sum and min segment trees in its compiled extension, which does not load
with the torch this project pins ("SumSegmentTreeFp32 is not available"). This one keeps the ``p^α`` of every slot in
one tensor and draws with an inclusive prefix sum and ``searchsorted``: O(capacity) work per draw, but a few
vectorised ops on the storage's device, with no Python loop per sample and no host sync (the same code on CUDA).
On this 2-core CPU a ``sample()`` of 2,048 transitions from a full 200k-slot buffer, with 512 priorities written
back, costs a little more than a uniform one (``benchmarks/replay_sample.py``; docs/history/snake.md, "DQN: four
learning-side tries, none adopted", under "Prioritized replay"); the replay data module draws the batches of every
update a collection earns in one call.
It plugs into ``TensorDictReplayBuffer(sampler=..., priority_key=...)`` like TorchRL's: ``sample`` returns the indices
and ``{"priority_weight": w}`` (the buffer adds ``index`` to the batch; ``DQNLoss`` averages its per-sample losses with
these weights, ``Σ w·l / Σ w``), ``extend``/``add`` give new slots the largest priority, ``update_priority(index,
|δ|)`` writes new priorities, and ``state_dict`` holds everything a resume needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage

from compat.torchrl import sampler_generator


class ProportionalSampler(Sampler):
    """Proportional prioritized sampling with importance weights, vectorised in torch.

    Args:
        max_capacity: slots of the storage it samples from.
        alpha: priority exponent α (0: uniform; the Mario reference uses 0.7).
        beta: importance-weight exponent β (0: no correction, 1: full). The replay data module raises it over training.
        eps: added to every priority so that no transition is never drawn again.
        device: where the priorities live (the storage's device).
    """

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-6,
        device: torch.device | str = "cpu",
    ) -> None:
        if max_capacity < 1:
            raise ValueError(f"max_capacity must be >= 1, got {max_capacity}")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0 (use a uniform sampler for 0), got {alpha}")
        if not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.alpha, self.beta, self.eps = alpha, beta, eps
        # float64: the prefix sum over hundreds of thousands of slots must not lose the small priorities' mass.
        self._priority = torch.zeros(max_capacity, dtype=torch.float64, device=device)  # p^α; 0 = empty slot
        self._max_priority = torch.ones((), dtype=torch.float64, device=device)  # the largest |δ| + eps seen (raw)

    @property
    def default_priority(self) -> torch.Tensor:
        """The priority of a new transition: the largest seen so far (a tensor, so no host sync on CUDA)."""
        return self._max_priority

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        filled = len(storage)
        if filled == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        priority = self._priority[:filled]
        cumulative = priority.cumsum(0)
        mass = torch.rand(batch_size, generator=sampler_generator(self), dtype=torch.float64, device=priority.device)
        # Slot i owns [cumulative[i-1], cumulative[i]): drawn with probability p_i^α / Σ p^α; empty slots own nothing.
        index = torch.searchsorted(cumulative, mass * cumulative[-1], right=True).clamp_max_(filled - 1)
        weight = (priority[index] / priority.min()).pow(-self.beta)
        return index, {"priority_weight": weight.to(torch.float32)}

    def add(self, index: int) -> None:
        self.extend(torch.as_tensor(index).reshape(1))

    def extend(self, index: torch.Tensor) -> None:
        index = torch.as_tensor(index, device=self._priority.device).reshape(-1)
        self._priority[index] = self._max_priority.pow(self.alpha)

    @torch.no_grad()
    def update_priority(
        self, index: int | torch.Tensor, priority: float | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        """Set the priorities of the slots ``index`` from their absolute TD errors ``priority``."""
        device = self._priority.device
        index = torch.as_tensor(index, device=device).reshape(-1)
        raw = torch.as_tensor(priority, device=device, dtype=torch.float64).detach().reshape(-1).abs() + self.eps
        if raw.numel() == 1:
            raw = raw.expand_as(index)
        elif raw.shape != index.shape:
            raise ValueError(f"{index.numel()} indices but {raw.numel()} priorities")
        self._priority[index] = raw.pow(self.alpha)
        torch.maximum(self._max_priority, raw.max(), out=self._max_priority)

    def mark_update(self, index: int | torch.Tensor, *, storage: Storage | None = None) -> None:
        self.extend(torch.as_tensor(index))

    def _empty(self) -> None:
        self._priority.zero_()
        self._max_priority.fill_(1.0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "priority": self._priority.clone(),
            "max_priority": self._max_priority.clone(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["priority"].shape != self._priority.shape:
            raise ValueError(
                f"the checkpoint's priorities are for {state_dict['priority'].numel()} slots, this buffer has "
                f"{self._priority.numel()}: resume with the buffer_size the run was started with"
            )
        self.alpha, self.beta, self.eps = state_dict["alpha"], state_dict["beta"], state_dict["eps"]
        self._priority.copy_(state_dict["priority"])
        self._max_priority.copy_(state_dict["max_priority"])

    def dumps(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "sampler_priorities.pt")

    def loads(self, path: str | Path) -> None:
        self.load_state_dict(torch.load(Path(path) / "sampler_priorities.pt", weights_only=True))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self._priority.numel()}, alpha={self.alpha}, beta={self.beta})"
