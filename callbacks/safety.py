"""Is the learned safety probability right? ``V(x)`` against Monte-Carlo success rates of the greedy policy.

A PIRL Q-network claims ``V(x) = maxₐ Q(x, a)`` is the probability that the car (or the toy system) stays safe until
its horizon runs out. This callback checks the claim where it can be checked: it draws held-out start states, plays
many independent greedy rollouts from each (one batched environment of ``states × rollouts``, each rollout on its
own noise stream), and compares ``V`` with the fraction that succeeded. It also plays uniformly random actions from
the same states, so the learned policy's success rate is seen beside a random policy's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from tensordict import TensorDict

from callbacks.schedule import PeriodicEvaluation
from datamodules.base import fixed_seed

# Held-out states come from seeds no training or evaluation environment uses.
SAFETY_SEED = 2_000_003


@torch.no_grad()
def success_rates(env: Any, actions: Any, rollouts: int, seed: int) -> torch.Tensor:
    """Fraction of ``rollouts`` continuations of each of the env's current states that reach the horizon safely.

    Args:
        env: a :class:`~envs.safety.base.SafetyEnv` holding the start states.
        actions: ``observation [n, d] -> action indices [n]``.
        rollouts: continuations per state.
        seed: first noise stream of the continuations.
    """
    copies = env.replicate(rollouts, seed)
    td = TensorDict({"observation": copies.state.clone()}, batch_size=copies.batch_size, device=copies.device)
    running = torch.ones(copies.batch_size, dtype=torch.bool, device=copies.device)
    success = torch.zeros(copies.batch_size, device=copies.device)
    # τ ≤ tau_max bounds every episode; the guard only protects against an environment that never ends.
    for _ in range(int(env.tau_max / env.dt) + 2):
        td["action"] = actions(td["observation"])
        out = copies.step(td)["next"]
        success += out["reward"].view(-1) * running
        running &= ~out["done"].view(-1)
        if not bool(running.any()):
            break
        td = out.select("observation")
    return success.view(-1, rollouts).mean(1)


class SafetyEvaluation(PeriodicEvaluation):
    """Every ``every_n_frames`` frames and at the end of ``fit``: ``V(x)`` against Monte-Carlo success rates.

    Logs ``eval/safety_mae`` (mean |V − success rate| over the held-out states), ``eval/safety_mae_constant`` (the
    same for a constant guess at the mean success rate: roughly what a V that learned nothing would score),
    ``eval/return_mean`` (the greedy policy's success rate) and ``eval/value_mean``; once per run, at its first
    evaluation, ``eval/random_return_mean`` (a uniformly random policy's success rate from the same states). At the
    end of ``fit`` it writes ``safety.json`` (with every state's V and success rate) and ``safety.png`` (V against
    the Monte-Carlo estimate) into the log folder. Its time is the throughput report's ``eval`` phase.

    Args:
        every_n_frames: frames between evaluations.
        states: held-out start states (the issue asks for ≥ 256).
        rollouts: greedy rollouts per state (the binomial standard error is at most 0.5 / √rollouts).
        random_policy: also measure a uniformly random policy from the same states (once per run).
        at_start: also evaluate before the first update.
    """

    def __init__(
        self,
        every_n_frames: int = 100_000,
        states: int = 256,
        rollouts: int = 256,
        random_policy: bool = True,
        at_start: bool = False,
    ) -> None:
        super().__init__(every_n_frames=every_n_frames, at_start=at_start, random_policy=random_policy)
        if states < 1:
            raise ValueError(f"states must be >= 1, got {states}")
        if rollouts < 1:
            raise ValueError(f"rollouts must be >= 1, got {rollouts}")
        self.states, self.rollouts = states, rollouts
        self.last: dict[str, Any] = {}

    def _held_out_states(self, trainer: pl.Trainer) -> tuple[Any, torch.Tensor]:
        """An environment of ``states`` cars at the held-out start states, and their observations."""
        env = trainer.datamodule.make_env(self.states, SAFETY_SEED)
        return env, env.reset()["observation"]

    def measure(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        env, start = self._held_out_states(trainer)
        network = pl_module.export_network()
        value = network(start).max(-1).values
        greedy = success_rates(env, lambda obs: network(obs).argmax(-1), self.rollouts, SAFETY_SEED + self.states)
        error = (value - greedy).abs()
        metrics = {
            "safety_mae": error.mean().item(),
            "safety_mae_constant": (greedy - greedy.mean()).abs().mean().item(),
            "return_mean": greedy.mean().item(),
            "value_mean": value.mean().item(),
        }
        self.last = {"metrics": metrics, "states": start.tolist(), "value": value.tolist(), "success": greedy.tolist()}
        return metrics

    def measure_random(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        env, _ = self._held_out_states(trainer)
        num_actions = int(trainer.datamodule.action_spec.space.n)

        def random_actions(obs: torch.Tensor) -> torch.Tensor:
            return torch.randint(num_actions, obs.shape[:1], device=obs.device)

        # Seeded apart from training: the figure repeats, and the training run's random stream does not move.
        with fixed_seed(SAFETY_SEED, env.device):
            return {"return_mean": success_rates(env, random_actions, self.rollouts, SAFETY_SEED).mean().item()}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.last:
            return
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        report = {
            "frames": trainer.datamodule.frames * trainer.world_size,
            "updates": trainer.global_step,
            "states": self.states,
            "rollouts": self.rollouts,
            **self.last,
            # The random policy's success rate, measured once per run, beside the latest greedy figures.
            "metrics": {**self.last["metrics"], **{key.removeprefix("eval/"): v for key, v in self.random.items()}},
        }
        (folder / "safety.json").write_text(json.dumps(report))
        self._plot(folder / "safety.png")
        metrics = report["metrics"]
        print(
            f"Safety probability: mean |V - Monte Carlo| = {metrics['safety_mae']:.4f} over {self.states} states x "
            f"{self.rollouts} rollouts (a constant guess: {metrics['safety_mae_constant']:.4f}); greedy success "
            f"{metrics['return_mean']:.3f}, random {metrics.get('random_return_mean', float('nan')):.3f} "
            f"-> {folder / 'safety.json'}"
        )

    def _plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        ax.plot([0, 1], [0, 1], "k--", linewidth=1)
        ax.scatter(self.last["success"], self.last["value"], s=8, alpha=0.6)
        ax.set_xlabel(f"Monte-Carlo success rate ({self.rollouts} greedy rollouts)")
        ax.set_ylabel("V(x) = max_a Q(x, a)")
        ax.set_title(f"MAE {self.last['metrics']['safety_mae']:.3f} over {self.states} held-out states")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
