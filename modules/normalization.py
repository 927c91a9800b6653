"""Observation normalisation: running statistics the learner keeps, applied by TorchRL transforms in every environment
(and reward scaling, :class:`RewardScaler`, applied by the learner to each rollout).

:class:`ObservationNormalizer` holds the running mean and variance of the raw observations (buffers of the model: in
every checkpoint, restored in place) and TorchRL's ``ObservationNorm`` that applies them, ``(x − mean) / √(var + ε)``,
clipped to ±``clip``, and keeps the raw observation beside it (``raw_observation``) for the statistics, in one pass
(:class:`SharedObservationNorm`). The agent hands it to the data module in its ``env_transform``.

**One set of statistics everywhere.** The data module clones the transform for each environment it builds, and a
TorchRL transform's clone shares its buffers. TorchRL's multi-process collectors cloudpickle the worker processes'
environment factories, which would copy them, so :class:`SharedObservationNorm` pickles its two as handles to shared
memory. The training environments (in this process, behind ``EnvWorkers``, in ``CollectorWorkers``' processes) and
the evaluation environments all normalise with the very tensors the learner holds, and none of them updates them:
evaluation uses the statistics as they are.

**Updated by the learner, once per rollout.** The agent calls :meth:`ObservationNormalizer.update` on each rollout's raw
observations when it comes in (PPO's ``postprocess``), between two collections, so the next rollout acts with
statistics that include it (Chan et al.'s parallel update of mean and variance, in float64; with DDP every rank's
rollout is merged, so the ranks normalise alike). TorchRL's ``VecNorm`` (and Stable-Baselines3's ``VecNormalize``)
update inside the environments after every step instead: each collector worker would keep statistics of its own, or
update shared ones in whatever order the processes happen to step, so that neither a run nor its resume repeats (and a
batched environment's partial reset would count the environments that did not reset again). Here the statistics are a
function of the rollouts alone, the same for every collection strategy, and a checkpoint holds them exactly. The
rollout stores the observations as normalised when acted on, so PPO's ratio compares the policy on the inputs it
acted with. Until the first rollout is in, the statistics are mean 0 and variance 1: the first rollout acts on the raw
observations, clipped.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.data import Composite
from torchrl.envs import ClipTransform, ObservationNorm, Transform

RAW_OBSERVATION = "raw_observation"


class ObservationNormalizer(nn.Module):
    """Running mean and variance of observations of ``shape``, and the transforms that apply them (module docstring).

    Args:
        shape: one observation's shape.
        clip: normalised observations are clipped to ``[-clip, clip]`` (Stable-Baselines3's and CleanRL's 10).
        epsilon: added to the variance before its square root (the same defaults' 1e-8).
    """

    def __init__(self, shape: Sequence[int], clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.clip, self.epsilon = clip, epsilon
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(tuple(shape), dtype=torch.float64))
        self.register_buffer("var", torch.ones(tuple(shape), dtype=torch.float64))
        # The transform the environments apply: its loc and scale are the float32 mean and √(var + ε).
        self.norm = SharedObservationNorm(loc=torch.zeros(tuple(shape)), scale=torch.ones(tuple(shape)), clip=clip)

    def transforms(self) -> list[Transform]:
        """:attr:`norm` itself (each environment's clone shares its buffers), to go into the agent's ``Compose``."""
        return [self.norm]

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """What the transforms compute, on a tensor (the exported policy reads raw observations)."""
        return ((observation - self.norm.loc) / self.norm.scale).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, raw: torch.Tensor) -> None:
        """Merge the raw observations ``raw`` (``[..., *shape]``) into the statistics and write the transform's loc and
        scale. With several processes (DDP) every rank's are merged: each rank calls this with its own rollout."""
        merge_moments(self.count, self.mean, self.var, raw.reshape(-1, *self.mean.shape))
        self.norm.loc.copy_(self.mean)
        self.norm.scale.copy_(torch.sqrt(self.var + self.epsilon))


def merge_moments(count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, x: torch.Tensor) -> None:
    """Merge the samples ``x`` (``[samples, *mean.shape]``; with DDP every rank's) into the running ``count``,
    ``mean`` and ``var`` (float64 buffers), in place."""
    if on_host(x, count):
        # NumPy views of the same buffers (:func:`on_host`): the merge's twenty-odd operations on arrays of a few
        # numbers each, every one several times cheaper than a torch op's dispatch and allocation.
        count, mean, var, x = count.numpy(), mean.numpy(), var.numpy(), x.numpy().astype(np.float64)
        n = np.float64(x.shape[0])
        batch_mean = x.sum(0) / n
        batch_var = ((x - batch_mean) ** 2).sum(0) / n
    else:
        x = x.to(torch.float64)
        n = reduce(torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device))
        batch_mean = reduce(x.sum(0)) / n
        batch_var = reduce(((x - batch_mean) ** 2).sum(0)) / n
    # Chan, Golub and LeVeque's parallel update: the merged mean, and the merged sum of squared deviations.
    total = count + n
    delta = batch_mean - mean
    squares = var * count + batch_var * n + delta**2 * count * n / total
    mean += delta * n / total
    var[...] = squares / total
    count[...] = total


def on_host(*tensors: torch.Tensor) -> bool:
    """Whether the statistics' arithmetic on ``tensors`` runs in NumPy, on views of the same memory: on the CPU, in a
    process of its own (a DDP run sums every rank's figures with torch's collectives). Once per rollout the
    statistics take a few dozen operations on arrays of a few numbers (an observation's size, a rollout's rewards),
    where a torch op's dispatch and allocation cost several times NumPy's: a noticeable share of a cheap task's
    rollout (docs/history/gymnasium.md, "The rollout's statistics in NumPy"). The same expressions as torch's, so
    the same numbers up to the order of a sum's terms."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    return all(tensor.device.type == "cpu" and not tensor.requires_grad for tensor in tensors)


class RewardScaler(nn.Module):
    """Rewards divided by the running standard deviation of the discounted return, then clipped to ±``clip``: what
    Stable-Baselines3's ``VecNormalize(norm_reward=True)`` (the RL Zoo's ``normalize: true``) and CleanRL's
    ``NormalizeReward`` feed the learner, so that the critic's targets are of order 1 whatever the task's reward scale.

    Only the learner reads rewards, so the scaling is applied to each rollout as it comes in (before GAE), not in the
    environments: the environments and the episode metrics keep the task's own rewards. Like the observation
    statistics the statistics are the learner's buffers (in every checkpoint), updated once per rollout from the
    rollout alone. Each copy's running discounted return ``returns`` carries over from one rollout to the next (it is
    reset where an episode ends), so it is sized at the first rollout and restored with the checkpoint. The
    difference from ``VecNormalize``: a rollout is scaled with statistics that include the whole rollout, where the
    environment wrapper scales each step with those up to that step.

    Args:
        gamma: the discount of the running return (the agent's own).
        clip: scaled rewards are clipped to ``[-clip, clip]`` (Stable-Baselines3's 10).
        epsilon: added to the variance before its square root.
    """

    def __init__(self, gamma: float, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("returns", torch.zeros(0, dtype=torch.float64))  # per copy, sized at the first rollout
        self.register_load_state_dict_pre_hook(_size_returns_as_saved)

    @torch.no_grad()
    def scale_(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """Update the statistics with a ``[copies, steps, 1]`` rollout's rewards, and scale them in place."""
        copies, steps = reward.shape[:2]
        if self.returns.shape != (copies,):
            if self.returns.numel():
                raise ValueError(f"RewardScaler: rollouts of {copies} copies after rollouts of {self.returns.numel()}")
            self.returns = torch.zeros(copies, dtype=torch.float64, device=reward.device)
        r, going_on = reward.reshape(copies, steps).to(torch.float64), ~done.reshape(copies, steps)
        discounted = torch.empty_like(r)
        host = on_host(reward, self.returns)
        # On the host the same expressions run on NumPy views of the same memory (on_host).
        views = (r.numpy(), going_on.numpy(), self.returns.numpy(), discounted.numpy()) if host else None
        rewards, live, returns, out = views or (r, going_on, self.returns, discounted)
        for t in range(steps):  # the running return of each copy, reset after its episode's last step
            returns *= self.gamma
            returns += rewards[:, t]
            out[:, t] = returns
            returns *= live[:, t]
        merge_moments(self.count, self.mean, self.var, discounted.reshape(-1))
        if host:
            scaled = np.clip(rewards / np.sqrt(self.var.numpy() + self.epsilon), -self.clip, self.clip)
            reward.numpy()[...] = scaled.reshape(reward.shape)
        else:
            scaled = (r / torch.sqrt(self.var + self.epsilon)).clamp(-self.clip, self.clip)
            reward.copy_(scaled.reshape(reward.shape).to(reward.dtype))


def _size_returns_as_saved(scaler: RewardScaler, state_dict: dict, prefix: str, *args: Any) -> None:
    """The per-copy returns are sized by the first rollout: take the checkpoint's size before loading into them."""
    saved = state_dict.get(prefix + "returns")
    if saved is not None:
        scaler.returns = torch.zeros_like(saved, device=scaler.returns.device)


def reduce(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over the processes of a DDP run (itself in one process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(tensor)
    return tensor


class SharedObservationNorm(ObservationNorm):
    """TorchRL's ``ObservationNorm`` of the ``observation`` entry, ``(x − loc) / scale``, that also keeps the raw
    observation as ``raw_observation`` and clips the normalised one to ±``clip``: what ``RenameTransform(create_copy=
    True)``, ``ObservationNorm`` and ``ClipTransform`` do one after the other, with the same entries, values and
    specs (tests/agents/test_normalization.py), in one transform, since each transform of a chain costs a cheap task's
    step noticeable Python at every step.

    Its ``loc`` and ``scale`` stay the learner's tensors when it is pickled into a worker process: TorchRL's
    multi-process collectors cloudpickle the environment factories, which would copy them by value; these two travel
    through torch's multiprocessing pickler instead, as shared memory that the learner's in-place updates reach."""

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, clip: float) -> None:
        super().__init__(loc=loc, scale=scale, in_keys=["observation"], standard_normal=True)
        self.clip = clip

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        observation = next_tensordict.get("observation", None)
        if observation is None:  # ObservationNorm's own handling of a missing entry (tolerated at a reset)
            return super()._call(next_tensordict)
        next_tensordict.set(RAW_OBSERVATION, observation)
        next_tensordict.set("observation", self._apply_transform(observation).clamp(-self.clip, self.clip))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        raw = observation_spec["observation"].clone()
        observation_spec = super().transform_observation_spec(observation_spec)
        clip = ClipTransform(in_keys=["observation"], low=-self.clip, high=self.clip)
        observation_spec = clip.transform_observation_spec(observation_spec)
        observation_spec[RAW_OBSERVATION] = raw
        return observation_spec

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # a copy of the module's __dict__
        shared = ("loc", "scale")
        state["_buffers"] = {
            key: _Shared(value) if key in shared else value for key, value in state["_buffers"].items()
        }
        return state


class _Shared:
    """A tensor pickled as a handle to its shared memory (moved there first, in place: the learner's tensor itself)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        self.tensor.share_memory_()
        return _unpickle_shared, (bytes(ForkingPickler.dumps(self.tensor)),)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        return copy.deepcopy(self.tensor, memo)  # a copy of the model is a copy: only pickling shares


def _unpickle_shared(data: bytes) -> torch.Tensor:
    return ForkingPickler.loads(data)
