"""Advantage Actor-Critic (A2C) on TorchRL's ``A2CLoss``: one gradient step on each whole rollout.

Mnih et al., "Asynchronous Methods for Deep Reinforcement Learning", ICML 2016 (A3C; A2C is its synchronous form,
as OpenAI Baselines and Stable-Baselines3 run it, and as the RL Zoo tunes it).

Each rollout of ``collect_steps`` from each of ``num_envs`` copies gives its advantages (GAE; λ = 1 by default: the
n-step returns of the rollout's rest) and then one update: the policy gradient ``-(log π(a|s) · A)``, the weighted
value loss against the returns and entropy bonus, one optimizer step (RMSprop by default, as the paper's and
Stable-Baselines3's). The networks, the Gaussian policy of Box actions and the running normalisation are PPO's
(:class:`~modules.ppo.PPO`); so the data module is PPO's too, with one minibatch of the whole rollout and one epoch.

Usage::

    python -m app fit --config configs/gym/cartpole_a2c.yaml
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tensordict import TensorDict, TensorDictBase
from torchrl.data import TensorSpec
from torchrl.objectives import A2CLoss

from datamodules.source import DataSource
from modules.networks import NetworkOptions
from modules.optim import OptimizerOptions
from modules.ppo import CRITIC_LOSSES, PPO, GaussianOptions, NormalizationOptions


@dataclass(frozen=True)
class A2CLossOptions:
    """The A2C objective's terms: ``loss:`` in an A2C's ``init_args`` (Stable-Baselines3's defaults).

    Args:
        entropy_coef: weight of the entropy bonus (``ent_coef``).
        critic_coef: weight of the value loss (``vf_coef``).
        critic_loss: the value loss: ``l2`` (the squared error of Stable-Baselines3's A2C) or ``smooth_l1``.
        normalize_advantage: standardise the rollout's advantages (off in the paper and by default in
            Stable-Baselines3).
    """

    entropy_coef: float = 0.0
    critic_coef: float = 0.5
    critic_loss: Literal["smooth_l1", "l2"] = "l2"
    normalize_advantage: bool = False

    def __post_init__(self) -> None:
        if self.critic_loss not in CRITIC_LOSSES:
            raise ValueError(
                f"model.loss.critic_loss must be one of {', '.join(CRITIC_LOSSES)}, got {self.critic_loss!r}"
            )


class A2C(PPO):
    """A2C: PPO's actor, critic and advantages, and an update that is one policy-gradient step on the whole rollout.

    Args:
        observation_spec, action_spec, network, gaussian, normalize: as :class:`~modules.ppo.PPO`'s.
        gamma: discount.
        gae_lambda: GAE's λ (1: the rollout's n-step returns, as A2C was published and Stable-Baselines3's default).
        loss: the objective's terms (:class:`A2CLossOptions`).
        optimizer: RMSprop (α 0.99, ε 1e-5), learning rate 7e-4, the gradient's norm clipped at 0.5: Stable-Baselines3's
            A2C (:class:`~modules.optim.OptimizerOptions`; ``algorithm: adam`` for its ``use_rms_prop: false``).
        compile, check_finite_every: see :class:`~modules.base.RLModule`.
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        network: NetworkOptions = NetworkOptions(),
        gaussian: GaussianOptions = GaussianOptions(),
        normalize: NormalizationOptions = NormalizationOptions(),
        gamma: float = 0.99,
        gae_lambda: float = 1.0,
        loss: A2CLossOptions = A2CLossOptions(),
        optimizer: OptimizerOptions = OptimizerOptions(lr=7e-4, algorithm="rmsprop", eps=1e-5, max_grad_norm=0.5),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(
            observation_spec, action_spec, network, gaussian, normalize, gamma, gae_lambda, loss, optimizer, compile,
            check_finite_every,
        )  # fmt: skip

    def make_loss_module(self, options: A2CLossOptions) -> A2CLoss:
        return A2CLoss(
            self.actor,
            self.critic,
            entropy_coeff=options.entropy_coef,
            critic_coeff=options.critic_coef,
            loss_critic_type=options.critic_loss,
        )

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        super().check_datamodule(datamodule, cannot_capture)
        updates = datamodule.updates_per_rollout
        if updates is None:
            raise ValueError(
                f"data: A2C learns from each fresh rollout, {type(datamodule).__name__} replays stored transitions; "
                "use datamodules.rollout.RolloutDataModule"
            )
        if updates != 1:
            raise ValueError(
                f"data.minibatch_size, data.update_epochs: A2C takes one update on each whole rollout, these give "
                f"{updates}; use minibatch_size = num_envs x collect_steps and update_epochs 1"
            )

    def schedule(self, rollout: TensorDictBase) -> None:
        """Nothing changes with the frames but the learning rate (the base's)."""

    def batch_keys(self) -> list:
        # PPO's, less the behaviour log-probability: the policy gradient has no ratio (A2CLoss names no such key).
        return [key for key in super().batch_keys() if key is not None]

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """``A2CLoss``'s terms on the rollout, from the actor's and the critic's networks: the policy gradient of the
        (optionally standardised) advantages, the weighted value loss and entropy bonus, and the entropy to log.
        ``A2CLoss.forward`` returns the same numbers (tests/agents/test_a2c.py), through distribution objects and a
        copy of the batch at every update."""
        log_prob, entropy, critic, features = self.policy_terms(batch)
        losses = {"loss_objective": -(log_prob * self.advantage_of(batch)).mean(), "entropy": entropy.detach().mean()}
        if self.loss_options.entropy_coef:  # A2CLoss has no entropy term with a zero weight (the entropy is logged)
            losses["loss_entropy"] = -self.loss_module.entropy_coeff * entropy.mean()
        if self.loss_options.critic_coef:
            losses["loss_critic"] = self.value_loss(critic(features), batch)
        return TensorDict(losses, batch_size=[])
