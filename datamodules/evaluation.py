"""Greedy and random-policy evaluation: one episode per evaluation environment, always from the same seeds.

:class:`Evaluation` is a part of every :class:`~datamodules.base.RLDataModule` (a base class of it): the evaluation
environments take the training environment's options, except those in the data module's ``evaluation.env_options``,
and seeds offset from the training ones so that they never replay a training episode (:class:`EvaluationOptions`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.collectors import RandomPolicy
from torchrl.envs import EnvBase, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from compat.torchrl import next_step_input

if TYPE_CHECKING:
    from envs.base import EnvDeclaration

# Seeds of the evaluation environments are offset so they never replay a training episode.
EVAL_SEED_OFFSET = 1_000_003
#: Resamples of the bootstrap confidence interval, and the seed of its own generator (never the global one: an exact
#: resume replays that stream).
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2_000, 0


def episode_statistics(values: torch.Tensor, prefix: str = "return") -> dict[str, float]:
    """Mean, standard deviation, interquartile mean and a 95 % bootstrap confidence interval of the mean of per-episode
    ``values``, as ``<prefix>_mean``, ``_std``, ``_iqm``, ``_ci_low`` and ``_ci_high``.

    The IQM is the mean of the middle half of the values (scipy's ``trim_mean(values, 0.25)``), robust to a few outlying
    episodes, as Agarwal et al. (2021) recommend for RL results; the interval is the percentile bootstrap of the mean
    over episodes, drawn from a generator of its own so that the same values always give the same interval.
    """
    values = values.detach().double().flatten().cpu()
    count = values.numel()
    ordered = values.sort().values
    cut = int(0.25 * count)  # trim_mean's cut: int(proportion * n) values from each end
    iqm = ordered[cut : count - cut].mean()
    generator = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    means = values[torch.randint(count, (BOOTSTRAP_RESAMPLES, count), generator=generator)].mean(-1)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {
        f"{prefix}_mean": values.mean().item(),
        f"{prefix}_std": values.std().item() if count > 1 else 0.0,
        f"{prefix}_iqm": iqm.item(),
        f"{prefix}_ci_low": low,
        f"{prefix}_ci_high": high,
    }


def per_episode(value: torch.Tensor, episodes: int) -> torch.Tensor:
    """A step's entry ``[episodes, ...]`` as one value per episode: itself, or the mean over an episode's agents."""
    value = value.reshape(episodes, -1)
    return value.squeeze(-1) if value.shape[-1] == 1 else value.mean(-1)


@contextmanager
def fixed_seed(seed: int, device: torch.device) -> Iterator[None]:
    """Draw from the global generators (CPU, and ``device`` when it is a GPU) seeded with ``seed``, then put them back.

    For measurements that must be repeatable and must not move the training run's random stream (an exact resume
    replays that stream).
    """
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


@dataclass(frozen=True)
class EvaluationOptions:
    """The greedy evaluations' episodes: ``evaluation:`` in a data module's ``init_args``.

    Args:
        episodes: greedy episodes per evaluation (one evaluation environment each).
        env_options: options of the evaluation environments that differ from ``env``'s ``init_args`` (Mario:
            ``{noop_max: 8}``, random no-op starts so that greedy episodes in a deterministic game differ, where
            training explores with ε and needs none).
    """

    episodes: int = field(default=32, metadata={"formerly": "eval_episodes"})
    env_options: dict[str, Any] = field(default_factory=dict, metadata={"formerly": "eval_env_options"})

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"data.evaluation.episodes must be > 0, got {self.episodes}")
        object.__setattr__(self, "env_options", dict(self.env_options or {}))


class Evaluation:
    """Evaluation episodes of a data module: what it needs is its ``make_env``, ``seed``, ``evaluation`` (the
    episodes and the environments' options), ``render_options`` (videos), ``episode_metric_keys`` and
    ``episode_metric_over``, and its ``settle`` (collection running off the training thread must not draw from the
    global generator while an evaluation seeds it)."""

    _eval_env: EnvBase | None = None
    #: The returns of the episodes of the last :meth:`evaluate` call, in the evaluation environments' order.
    last_episode_returns: list[float] = []

    @torch.no_grad()
    def evaluate(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        episodes: int | None = None,
    ) -> dict[str, float]:
        """Play one episode of ``policy`` in each of ``episodes`` evaluation environments, always from the same seeds.

        Returns ``return_mean`` with its spread over the episodes (``return_std``, ``return_iqm`` and the 95 %
        bootstrap interval of the mean, ``return_ci_low`` and ``return_ci_high``: :func:`episode_statistics`),
        ``length_mean``, and ``<key>_mean`` for each of the env's ``episode_metric_keys`` (for Snake, ``food_mean``:
        food eaten per game); :attr:`last_episode_returns` keeps the episodes' returns. A key the env's
        ``episode_metric_over`` maps to another is averaged over the episodes where that one is positive (racing:
        ``lap_time_mean`` over the episodes that completed a lap; NaN if none did). Policies with exploration act
        deterministically here.

        In a multi-agent environment an episode is one environment's, and every figure is per agent: ``return_mean``
        is the mean over its agents of each agent's return; the episode lasts until all its agents are done.
        """
        self.settle()  # nothing else may draw from the global generator while an evaluation seeds it
        env = self._evaluation_env(episodes)
        episodes = env.batch_size[0]
        sums = {key: torch.zeros(episodes, device=env.device) for key in ("reward", *self.declared.episode_metric_keys)}
        length = torch.zeros(episodes, device=env.device)
        # 1 while an episode runs, 0 after its last step: a step adds each entry times it (exact: x·1 and x·0) in one
        # fused kernel per entry, so that a loop of a cheap environment's steps is not mostly this bookkeeping.
        running = torch.ones(episodes, device=env.device)
        td = env.reset()
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            while True:
                td = env.step(policy(td))
                following = td.get("next")
                for key, total in sums.items():
                    total.addcmul_(per_episode(following.get(key), episodes), running)
                length += running
                running.masked_fill_(following.get("done").reshape(episodes, -1).all(-1), 0.0)
                if not bool(running.any()):
                    break
                td = next_step_input(env, td)
        returns = sums.pop("reward")
        self.last_episode_returns = returns.tolist()
        metrics = {**episode_statistics(returns), "length_mean": length.mean().item()}
        for key, total in sums.items():
            over = self.declared.episode_metric_over
            counted = sums[over[key]] > 0 if key in over else None
            if counted is None:
                metrics[f"{key}_mean"] = total.mean().item()
            else:  # NaN when no episode counts: a missing point of the curve, not a zero
                metrics[f"{key}_mean"] = total[counted].mean().item() if bool(counted.any()) else float("nan")
        return metrics

    def evaluate_random(self, episodes: int | None = None) -> dict[str, float]:
        """:meth:`evaluate` with uniformly random actions (TorchRL's ``RandomPolicy`` over the action spec).

        The baseline a learned policy is measured against: same boards, same metrics. The actions are drawn from a
        generator seeded like the boards, so the figure is the same at every call, and the training run's own random
        stream is left where it was.
        """
        self.settle()
        env = self._evaluation_env(episodes)
        with fixed_seed(self.seed + EVAL_SEED_OFFSET, env.device):
            return self.evaluate(RandomPolicy(env.action_spec), episodes)

    @torch.no_grad()
    def record(
        self,
        policy: Callable[[TensorDictBase], TensorDictBase],
        episodes: int,
        frame: Callable[[np.ndarray], None],
        max_frames: int | None = None,
    ) -> list[dict[str, float]]:
        """Play evaluation episodes ``0 … episodes - 1`` of ``policy`` one after the other, handing each frame
        (the environment's ``render``, the start state first) to ``frame``; returns each one's ``return`` and
        ``length`` (steps) and ``frames`` (images handed on).

        Episode ``i`` is played by one environment seeded as :meth:`evaluate`'s ``i``-th (an environment ``i`` of a
        batch plays what one seeded ``seed + i`` plays), so it is that evaluation's episode, one at a time: frames
        go to the encoder as they are drawn, never a whole video in memory. ``max_frames`` cuts an episode's
        recording (and its play) after that many frames; None: the whole episode. In a multi-agent environment the
        return is the mean over its agents, as in :meth:`evaluate`.
        """
        self.settle()
        results = []
        for episode in range(episodes):
            options = {**self.evaluation.env_options, **self.declared.render_options}
            env = self.make_env(1, self.seed + EVAL_SEED_OFFSET + episode, options=options)
            drawn = env.base_env if isinstance(env, TransformedEnv) else env
            try:
                td = env.reset()
                frame(drawn.render(0))
                total, length = 0.0, 0
                with set_exploration_type(ExplorationType.DETERMINISTIC):
                    while max_frames is None or length + 1 < max_frames:
                        td = env.step(policy(td))
                        total += td["next", "reward"].mean().item()
                        length += 1
                        frame(drawn.render(0))
                        if bool(td["next", "done"].all()):
                            break
                        td = next_step_input(env, td)
            finally:
                env.close()
            results.append({"return": total, "length": length, "frames": length + 1})
        return results

    def _evaluation_env(self, episodes: int | None) -> EnvBase:
        """One environment per episode, reset to the same start states at every evaluation."""
        episodes = episodes or self.evaluation.episodes
        if self._eval_env is None or self._eval_env.batch_size[0] != episodes:
            options = self.evaluation.env_options
            self._eval_env = self.make_env(episodes, self.seed + EVAL_SEED_OFFSET, options=options)
        self._eval_env.set_seed(self.seed + EVAL_SEED_OFFSET)
        return self._eval_env

    def close_evaluation_env(self) -> None:
        """Close the evaluation environments (rebuilt at the next evaluation)."""
        if self._eval_env is not None:
            self._eval_env.close()
            self._eval_env = None

    # Provided by the data module.
    seed: int
    evaluation: EvaluationOptions
    declared: EnvDeclaration

    def settle(self) -> None: ...

    def make_env(self, num_envs: int, seed: int, options: dict[str, Any] | None = None) -> EnvBase:
        raise NotImplementedError
