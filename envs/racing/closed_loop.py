"""ClosedLoopEvaluation: drive the model's policy on the track, beside the expert from the same starts.

A cloned policy's validation loss says how close it is to the expert on the expert's own states; on the track its
small errors compound into states the expert never visited. So every ``every_n_epochs`` epochs (and after the last)
this callback drives the model's ``policy()`` for one whole episode from each of ``cars`` fixed starts and logs
``eval/return_mean``, ``eval/laps_mean``, ``eval/lap_time_mean`` (the first lap's time, over the cars that completed
one), ``eval/lap_completed`` (their share) and ``eval/never_off_track``; the expert's figures from the same starts
are logged once as ``eval/expert_*``, and ``eval/return_vs_expert`` is the ratio of the two returns. With
``held_out`` (an environment with a circuit distribution, ``tracks``), the cars drive the held-out circuits instead,
spread evenly over them: the figures then say how the clone drives circuits it never saw.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from envs.racing.env import drive_episodes, episode_summary
from envs.racing.expert import TimeOptimalExpert

# Starts of the evaluation cars: seeds far from the demonstrations' (seed + car index).
EVAL_SEED = 1_000_003


class ClosedLoopEvaluation(Callback):
    """Closed-loop evaluation of a racing policy.

    Args:
        every_n_epochs: epochs between evaluations (and one after the last epoch).
        cars: starts, one episode each.
        held_out: drive the environment's held-out circuits (``tracks: {split: held_out}``) rather than its own.
    """

    def __init__(self, every_n_epochs: int = 10, cars: int = 64, held_out: bool = False) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        if cars < 1:
            raise ValueError(f"cars must be >= 1, got {cars}")
        self.every_n_epochs, self.cars, self.held_out = every_n_epochs, cars, held_out
        self.expert: dict[str, float] | None = None
        self.history: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch + 1
        last = trainer.max_epochs is not None and epoch >= trainer.max_epochs
        if epoch % self.every_n_epochs and not last:
            return
        env = trainer.datamodule.env_factory(num_envs=self.cars, seed=EVAL_SEED, device=pl_module.device)
        if self.held_out:
            tracks = env.init_kwargs()["tracks"]
            if tracks is None:
                raise ValueError("ClosedLoopEvaluation held_out: the environment has no circuit distribution (tracks)")
            env = trainer.datamodule.env_factory(
                num_envs=self.cars,
                seed=0,  # car i drives held-out circuit i mod count: every circuit evenly
                device=pl_module.device,
                tracks={**tracks, "split": "held_out", "per": "env"},
            )
        if self.expert is None:
            self.expert = episode_summary(drive_episodes(env, TimeOptimalExpert(env)), env.width)
        was_training = pl_module.training
        pl_module.eval()
        metrics = episode_summary(drive_episodes(env, pl_module.policy()), env.width)
        pl_module.train(was_training)
        metrics["return_vs_expert"] = metrics["return_mean"] / self.expert["return_mean"]
        logged = {f"eval/{key}": value for key, value in metrics.items() if not math.isnan(value)}
        logged.update({f"eval/expert_{key}": value for key, value in self.expert.items() if not math.isnan(value)})
        pl_module.log_dict(logged)
        self.history.append({"epoch": epoch, **metrics})

    def state_dict(self) -> dict[str, Any]:
        return {"expert": self.expert, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.expert, self.history = state_dict["expert"], state_dict["history"]
