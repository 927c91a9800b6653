"""Proximal Policy Optimization on TorchRL's ``ClipPPOLoss`` and ``GAE``.

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347, 2017; GAE: Schulman et al.,
"High-Dimensional Continuous Control Using Generalized Advantage Estimation", ICLR 2016.

The policy follows the action space: a categorical distribution over a discrete space's actions, a Gaussian over a
Box's (:mod:`modules.gaussian`; the ``gaussian`` options). ``normalize: {observations: true}`` standardises the
observations with running statistics, in every environment the policy acts in (:mod:`modules.normalization`).

Usage::

    python -m app fit --config configs/snake_ppo.yaml
    python -m app fit --config configs/racing_ppo.yaml
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import Compose, Transform
from torchrl.modules import ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE
from torchrl.objectives.value.functional import generalized_advantage_estimate

from modules.actors import CategoricalActor, DirectActor
from modules.base import RLModule
from modules.gaussian import DISTRIBUTIONS, SCALES, ClipAction, DeterministicAction, gaussian_actor, gaussian_outputs
from modules.networks import (
    NATURE_CNN_FEATURES,
    NetworkOptions,
    TorsoHead,
    heads_on_features,
    is_nature_cnn,
    observation_network,
    orthogonal_init_,
)
from modules.normalization import RAW_OBSERVATION, ObservationNormalizer, RewardScaler
from modules.optim import OptimizerOptions
from modules.spaces import BOX, DISCRETE, SpaceError, box_bounds, check_action_space, check_bounded, observation_entry

#: The value losses of ``loss.critic_loss``.
CRITIC_LOSSES = ("smooth_l1", "l2")


@torch.no_grad()
def rollout_values(critic: nn.Module, rollout: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
    """V(s_t) and V(s_{t+1}) over a ``[..., steps]`` rollout, the critic run once per distinct observation.

    The next observation of step ``t`` is step ``t + 1``'s observation except where an episode ended at ``t`` (the
    next step starts another) and at the rollout's last step: only those next observations go through the critic
    again, so a rollout costs ``steps + 1`` evaluations per environment and a few, not TorchRL's ``2 * steps`` (a Nature
    CNN's pass over Atari frames: docs/results/gymnasium.md, "GAE's values, once per distinct observation"). The values
    are those TorchRL's ``GAE`` computes with the critic as its value network, up to the rounding of other batch sizes
    (tests/agents/test_ppo.py).
    """
    observation, next_observation = rollout["observation"], rollout["next", "observation"]
    batch = rollout.batch_size
    value = critic(observation.flatten(0, len(batch) - 1)).view(*batch, -1)
    next_value = torch.empty_like(value)
    next_value[..., :-1, :] = value[..., 1:, :]
    fresh = rollout["next", "done"].reshape(*batch, -1).any(-1)
    fresh[..., -1] = True
    next_value[fresh] = critic(next_observation[fresh]).view(-1, value.shape[-1])
    return value, next_value


def check_advantage_options(gamma: float, gae_lambda: float) -> None:
    for name, value in (("gamma", gamma), ("gae_lambda", gae_lambda)):
        if not 0 <= value <= 1:
            raise ValueError(f"model.{name} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class PPOLossOptions:
    """The clipped objective's terms: ``loss:`` in a PPO's (or RecurrentPPO's) ``init_args``.

    Args:
        clip_epsilon: PPO's ratio clip.
        clip_decay_frames: with a value, the clip falls linearly from ``clip_epsilon`` to 0 over this many frames,
            set at each rollout (the RL Zoo's ``clip_range: lin_0.2``); None: constant.
        entropy_coef: weight of the entropy bonus.
        critic_coef: weight of the value loss.
        critic_loss: the value loss: ``smooth_l1`` (Huber: a return far from the estimate pulls no harder than one at
            distance 1) or ``l2`` (the squared error of Stable-Baselines3's and CleanRL's PPO).
        normalize_advantage: standardise advantages within each minibatch.
    """

    clip_epsilon: float = 0.2
    clip_decay_frames: int | None = None
    entropy_coef: float = 0.01
    critic_coef: float = 0.5
    critic_loss: Literal["smooth_l1", "l2"] = "smooth_l1"
    normalize_advantage: bool = True

    def __post_init__(self) -> None:
        if not self.clip_epsilon > 0:
            raise ValueError(f"model.loss.clip_epsilon must be > 0, got {self.clip_epsilon}")
        if self.clip_decay_frames is not None and self.clip_decay_frames < 1:
            raise ValueError(f"model.loss.clip_decay_frames must be >= 1 (or null), got {self.clip_decay_frames}")
        if self.critic_loss not in CRITIC_LOSSES:
            raise ValueError(
                f"model.loss.critic_loss must be one of {', '.join(CRITIC_LOSSES)}, got {self.critic_loss!r}"
            )


@dataclass(frozen=True)
class GaussianOptions:
    """The Gaussian policy of Box actions: ``gaussian:`` in a PPO's ``init_args`` (:mod:`modules.gaussian`).

    Args:
        distribution: ``normal`` (the Gaussian PPO was published with, the default: exact log-probabilities and
            entropy; a sample outside the box reaches the environment clipped to it, the rollout keeping the sample)
            or ``tanh_normal`` (squashed into the box; its entropy is estimated from a sample; needs a bounded box).
        scale: the Gaussian's σ, ``state_independent`` (one learned log-σ per action dimension, starting at σ =
            ``init_scale``) or ``state_dependent`` (a second head of the actor's network).
        init_scale: the Gaussian's σ at the start, in half-ranges of the box (before tanh for ``tanh_normal``);
            Stable-Baselines3's ``log_std_init`` is its log.
    """

    distribution: Literal["normal", "tanh_normal"] = "normal"
    scale: Literal["state_independent", "state_dependent"] = "state_independent"
    init_scale: float = 1.0

    def __post_init__(self) -> None:
        for name, value, choices in (("distribution", self.distribution, DISTRIBUTIONS), ("scale", self.scale, SCALES)):
            if value not in choices:
                raise ValueError(f"model.gaussian.{name} must be one of {', '.join(choices)}, got {value!r}")
        if not self.init_scale > 0:
            raise ValueError(f"model.gaussian.init_scale must be > 0, got {self.init_scale}")


@dataclass(frozen=True)
class NormalizationOptions:
    """Running normalisation: ``normalize:`` in a PPO's ``init_args`` (:mod:`modules.normalization`).

    Args:
        observations: standardise observations with running statistics (mean and variance over every rollout so
            far, updated by the learner after each rollout) in every environment the policy acts in, clipped to
            ±``observation_clip``; the statistics are in the checkpoint. Float observations only.
        observation_clip: the normalised observations' bound.
        rewards: the learner divides each rollout's rewards by the running standard deviation of the discounted
            return (:class:`~modules.normalization.RewardScaler`: Stable-Baselines3's ``VecNormalize`` reward
            scaling, the RL Zoo's ``normalize: true``), clipped to ±``reward_clip``; the statistics are in the
            checkpoint. The environments and the episode metrics keep the task's rewards.
        reward_clip: the scaled rewards' bound.
    """

    observations: bool = field(default=False, metadata={"formerly": "normalize_observations"})
    observation_clip: float = 10.0
    rewards: bool = field(default=False, metadata={"formerly": "normalize_rewards"})
    reward_clip: float = 10.0

    def __post_init__(self) -> None:
        for name in ("observation_clip", "reward_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"model.normalize.{name} must be > 0, got {getattr(self, name)}")


def clip_ppo_loss(actor: TensorDictModuleBase, critic: TensorDictModuleBase, options: PPOLossOptions) -> ClipPPOLoss:
    """TorchRL's clipped PPO loss with the terms ``options`` weighs."""
    return ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=options.clip_epsilon,
        entropy_coeff=options.entropy_coef,
        critic_coeff=options.critic_coef,
        loss_critic_type=options.critic_loss,
        normalize_advantage=options.normalize_advantage,
    )


def decay_clip(loss: ClipPPOLoss, options: PPOLossOptions, frames: int) -> None:
    """Sets the clip the next updates use after ``frames`` frames: ``clip_epsilon`` falling linearly to 0 at
    ``clip_decay_frames`` (the loss's buffer, so a compiled loss reads the new value)."""
    left = max(0.0, 1.0 - frames / options.clip_decay_frames)
    loss.clip_epsilon.fill_(options.clip_epsilon * left)


def ppo_batch_keys(loss: ClipPPOLoss) -> list:
    """What a PPO update reads: the networks' stored inputs, the action taken and its log-probability, and the
    advantage and value target written by the agent's ``postprocess`` (so a rollout need not keep the next
    observations). Entries the actor computes itself (its LSTM output, which the critic head reads) are left out."""
    keys = loss.tensor_keys
    computed = set(loss.actor_network.out_keys) - {keys.action, keys.sample_log_prob}
    inputs = [key for key in (*loss.actor_network.in_keys, *loss.critic_network.in_keys) if key not in computed]
    return list(dict.fromkeys([*inputs, keys.action, keys.sample_log_prob, keys.advantage, keys.value_target]))


class PPO(RLModule):
    """Clipped-objective PPO with a separate actor and critic, advantages from GAE on each fresh rollout.

    The actor's distribution follows the action space: categorical over a discrete space's actions (``Categorical``),
    Gaussian over a Box (``gaussian``; :mod:`modules.gaussian`). Other action spaces
    (``OneHot``, ``MultiCategorical``, ``Binary``, ...) are one error line.

    Args:
        observation_spec: linked from the data module.
        action_spec: linked from the data module: discrete, or a Box (``Bounded``, or ``Unbounded``).
        network: what reads the observation, for actor and critic alike (:class:`~modules.networks.NetworkOptions`):
            ``mlp`` (flattened; the actor and the critic each have their own), ``nature_cnn`` (images: one
            :class:`~modules.networks.NatureCNN` that both read, each with a linear head, as Stable-Baselines3's
            ``CnnPolicy`` and CleanRL's Atari PPO; the update runs it once for both) or ``auto``. With
            ``orthogonal_init`` the gains are √2 on hidden layers, 0.01 on the actor's output, 1 on the critic's;
            without, PyTorch's default initialisation, the actor's output layer of a Gaussian policy scaled by 0.01.
        gaussian: the Gaussian policy of Box actions (:class:`GaussianOptions`); unused for discrete actions.
        normalize: running normalisation of observations and rewards (:class:`NormalizationOptions`).
        gamma: discount.
        gae_lambda: GAE's λ.
        loss: the clipped objective's terms (:class:`PPOLossOptions`).
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule` (PPO usually clips the gradient's
            norm at 0.5: ``optimizer: {max_grad_norm: 0.5}``).
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        network: NetworkOptions = NetworkOptions(),
        gaussian: GaussianOptions = GaussianOptions(),
        normalize: NormalizationOptions = NormalizationOptions(),
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        loss: PPOLossOptions = PPOLossOptions(),
        optimizer: OptimizerOptions = OptimizerOptions(lr=3e-4),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(observation_spec, action_spec, optimizer, compile, check_finite_every)
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        check_advantage_options(gamma, gae_lambda)
        if network.kind == "batch_norm_cnn":
            raise ValueError("model.network.kind batch_norm_cnn is DQN's; PPO reads with auto, mlp or nature_cnn")
        kind = check_action_space(self, action_spec, (DISCRETE, BOX))
        self.loss_options, self.distribution = loss, gaussian.distribution
        distribution = gaussian.distribution
        if kind == BOX and distribution == "tanh_normal":
            squashes = "model.gaussian.distribution tanh_normal squashes actions into a bounded box"
            check_bounded(action_spec, squashes, "use normal")
        observation = observation_entry(self, observation_spec)
        self.observation_normalizer = None
        if normalize.observations:
            self.observation_normalizer = make_normalizer(observation, normalize.observation_clip)
        self.reward_scaler = RewardScaler(gamma, normalize.reward_clip) if normalize.rewards else None

        outputs = action_spec.space.n if kind == DISCRETE else gaussian_outputs(action_spec, gaussian.scale)
        sizes, hidden = network.hidden_sizes, network.activation_module
        if is_nature_cnn(observation, network.kind):
            # One Nature CNN for both, a linear head each: Stable-Baselines3's CnnPolicy and CleanRL's Atari PPO.
            torso = observation_network(observation, network.kind, sizes, None)
            self.actor_network = TorsoHead(torso, nn.Linear(NATURE_CNN_FEATURES, outputs))
            self.critic_network = TorsoHead(torso, nn.Linear(NATURE_CNN_FEATURES, 1))
        else:
            self.actor_network = observation_network(observation, network.kind, sizes, outputs, hidden)
            self.critic_network = observation_network(observation, network.kind, sizes, 1, hidden)
        if network.orthogonal_init:
            orthogonal_init_(self.actor_network, output_gain=0.01)
            orthogonal_init_(self.critic_network, output_gain=1.0)
        elif kind == BOX:
            # The Gaussian's parameters start near 0 (CleanRL's 0.01 gain on the last layer): the first actions are
            # centred on the box, and a state-dependent σ starts at init_scale.
            with torch.no_grad():
                [*_, last] = (module for module in self.actor_network.modules() if isinstance(module, nn.Linear))
                last.weight.mul_(0.01)
                last.bias.zero_()
        if kind == DISCRETE:
            logits = TensorDictModule(self.actor_network, in_keys=["observation"], out_keys=["logits"])
            self.actor = CategoricalActor(logits, action_spec)
        else:
            self.actor = gaussian_actor(
                self.actor_network, action_spec, distribution, gaussian.scale, gaussian.init_scale
            )
        self.box_actions = kind == BOX
        # The box of a Gaussian's actions, for the update's log-densities (not saved: the action spec gives it).
        bounds = box_bounds(action_spec) if self.box_actions else None
        self.register_buffer("action_low", None if bounds is None else bounds[0], persistent=False)
        self.register_buffer("action_high", None if bounds is None else bounds[1], persistent=False)
        # CleanRL's ClipAction: the environment receives a normal sample clipped into the box (the rollout keeps it).
        self.clips_actions = self.box_actions and distribution == "normal" and bounds is not None
        self.critic = ValueOperator(self.critic_network, in_keys=["observation"])
        self.loss_module = self.make_loss_module(loss)
        # GAE on the values postprocess computes (rollout_values): no value network of its own. Its gamma and lambda
        # (in every checkpoint) are what advantages() computes with.
        self.advantage = GAE(gamma=gamma, lmbda=gae_lambda, value_network=None, average_gae=False)

    def make_loss_module(self, options: PPOLossOptions) -> ClipPPOLoss:
        """TorchRL's loss this agent's update computes (and its parameters, which the optimizer steps)."""
        return clip_ppo_loss(self.actor, self.critic, options)

    def policy(self) -> TensorDictModuleBase:
        return self.actor

    def greedy_policy(self) -> TensorDictModuleBase:
        # Under ExplorationType.DETERMINISTIC (set by evaluation and export) the actor takes the distribution's mode
        # (a Gaussian's mean, squashed for tanh_normal); an evaluation reads the action only.
        return self.actor.without_log_prob() if isinstance(self.actor, DirectActor) else self.actor

    def export_network(self) -> nn.Module:
        """Raw observation → the actor's logits (their argmax is the greedy action), or a Gaussian policy's
        deterministic action as the environment receives it; normalised first with ``normalize_observations``."""
        head = self.actor_network
        if self.box_actions:
            head = DeterministicAction(head, self.action_spec, self.distribution).to(self.device)
        return head if self.observation_normalizer is None else nn.Sequential(self.observation_normalizer, head)

    def env_transform(self) -> Transform | None:
        """What every environment the policy acts in carries: the observation normaliser, and for a normal Gaussian
        on a bounded box the clip of the action the environment receives."""
        transforms = [] if self.observation_normalizer is None else self.observation_normalizer.transforms()
        if self.clips_actions:
            transforms.append(ClipAction(*box_bounds(self.action_spec)))
        return Compose(*transforms) if transforms else None

    def setup(self, stage: str) -> None:
        self.connect_datamodule(stage, env_transform=self.env_transform())

    def batch_keys(self) -> list:
        return ppo_batch_keys(self.loss_module)

    @torch.no_grad()
    def postprocess(self, rollout: TensorDictBase) -> None:
        """GAE over the ``[num_envs, steps]`` rollout, writing ``advantage`` and ``value_target`` in place; then the
        rollout's raw observations into the normaliser's statistics, which the next rollout acts with. With
        ``normalize_rewards`` the rewards are scaled first, in place (the advantages are of the scaled rewards); with
        ``clip_decay_frames`` the clip this rollout's updates use is set from the frames so far, this rollout's
        included (as Stable-Baselines3 sets it after collecting)."""
        self.schedule(rollout)
        if self.reward_scaler is not None:
            self.reward_scaler.scale_(rollout["next", "reward"], rollout["next", "done"])
        value, next_value = rollout_values(self.critic_network, rollout)
        rollout.set("state_value", value)
        rollout.set(("next", "state_value"), next_value)
        self.advantages(rollout)
        if self.observation_normalizer is not None:
            self.observation_normalizer.update(rollout[RAW_OBSERVATION])

    def advantages(self, rollout: TensorDictBase) -> None:
        """What TorchRL's ``GAE`` module (``self.advantage``) writes, ``advantage`` and ``value_target``, from the
        rollout's values, computed as it computes them (its functional, on its gamma and lambda) without its per-call
        key handling, which costs a short rollout's GAE as much as its arithmetic (tests/agents/test_ppo.py)."""
        gae, after = self.advantage, rollout["next"]
        done = after["done"]
        advantage, value_target = generalized_advantage_estimate(
            gae.gamma,
            gae.lmbda,
            rollout["state_value"],
            after["state_value"],
            after["reward"],
            done=done,
            terminated=after.get("terminated", done),
            time_dim=rollout.batch_dims - 1,
        )
        rollout.set(gae.tensor_keys.advantage, advantage)
        rollout.set(gae.tensor_keys.value_target, value_target)

    def schedule(self, rollout: TensorDictBase) -> None:
        """What changes with the frames before ``rollout``'s updates: the clip, with ``clip_decay_frames``."""
        if self.loss_options.clip_decay_frames is not None:
            decay_clip(self.loss_module, self.loss_options, self.datamodule.frames + rollout.numel())

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        return ppo_update(self, batches)

    def policy_terms(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, nn.Module, torch.Tensor]:
        """The taken actions' log-probabilities and the policy's entropy under the current networks (the entropy
        detached where its weight is 0: logged, not trained on), the critic's head and the features it reads."""
        log_prob_and_entropy = gaussian_log_prob_and_entropy if self.box_actions else categorical_log_prob_and_entropy
        squash = self.distribution == "tanh_normal"
        actor, critic, features = heads_on_features(self.actor_layers(), self.critic_network, batch["observation"])
        inputs = {"observation": features, "action": batch["action"]}
        log_prob, entropy = log_prob_and_entropy(actor, inputs, squash, self.action_bounds)
        if not self.loss_options.entropy_coef:  # no backward through a term weighted 0
            entropy = entropy.detach()
        return log_prob, entropy, critic, features

    def advantage_of(self, batch: TensorDictBase) -> torch.Tensor:
        """The batch's advantages, standardised within it with ``normalize_advantage``."""
        advantage = batch[self.loss_module.tensor_keys.advantage].squeeze(-1)
        if self.loss_options.normalize_advantage and advantage.numel() > 1:
            advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-6)
        return advantage

    def value_loss(self, value: torch.Tensor, batch: TensorDictBase) -> torch.Tensor:
        """The weighted value loss of the critic's ``value`` against the batch's targets."""
        distance = F.mse_loss if self.loss_options.critic_loss == "l2" else F.smooth_l1_loss
        return self.loss_module.critic_coeff * distance(value, batch[self.loss_module.tensor_keys.value_target])

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """``ClipPPOLoss``'s terms on a minibatch, from the actor's and the critic's networks: the clipped surrogate of
        the (standardised) advantages, the weighted value loss and entropy bonus, with the clip fraction, the
        approximate KL and the entropy to log. ``ClipPPOLoss.forward`` returns the same numbers from the same random
        draws (tests/agents/test_ppo_continuous.py); it also builds distribution objects, copies the batch and
        computes diagnostics at every update, which cost a small network's update more than its arithmetic
        (docs/history/gymnasium.md, "Against Stable-Baselines3: what changed before the runs of 10:51–18:32")."""
        ppo, keys = self.loss_module, self.loss_module.tensor_keys
        log_prob, entropy, critic, features = self.policy_terms(batch)
        advantage = self.advantage_of(batch)
        log_weight = log_prob - batch[keys.sample_log_prob]
        clip = ppo.clip_epsilon  # a buffer: clip_decay_frames lowers it rollout by rollout
        clipped = log_weight.clamp((-clip).log1p(), clip.log1p())  # the ratio's clip, in logs, as ClipPPOLoss's
        surrogate = torch.min(log_weight.exp() * advantage, clipped.exp() * advantage)
        losses = {
            "loss_objective": -surrogate.mean(),
            "loss_entropy": -ppo.entropy_coeff * entropy.mean(),
            "entropy": entropy.detach().mean(),
            "clip_fraction": (clipped != log_weight).float().mean(),
            "kl_approx": -log_weight.detach().mean(),
        }
        if self.loss_options.critic_coef:  # ClipPPOLoss has no value loss with a zero weight
            losses["loss_critic"] = self.value_loss(critic(features), batch)
        return TensorDict(losses, batch_size=[])

    def actor_layers(self) -> list[nn.Module]:
        """The actor's own layers as plain modules: its network (the logits), or the network, σ and the box's units."""
        return [module.module for module in self.actor.modules() if type(module) is TensorDictModule]

    @property
    def action_bounds(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A Gaussian policy's box, on the model's device (None: discrete actions, or an unbounded box)."""
        return None if self.action_low is None else (self.action_low, self.action_high)


def make_normalizer(observation: TensorSpec, clip: float) -> ObservationNormalizer:
    """The running normaliser of ``normalize.observations``: float observations only (images are scaled by their
    network; integer planes and one-hot codes need none)."""
    if not observation.dtype.is_floating_point:
        raise SpaceError(
            f"model.normalize.observations standardises float observations; {SpaceError.ENV}'s are "
            f"{observation.dtype} (images are scaled by their network): use observations false"
        )
    return ObservationNormalizer(observation.shape, clip)


def ppo_update(model: RLModule, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
    """One PPO update on a minibatch: the clipped surrogate, entropy bonus and value loss, backward, gradient clip
    and Adam step (or all of it as one replayed CUDA graph). The advantages were computed when the rollout came in
    (``postprocess``)."""
    if model.graphed:
        losses = model.replay_graph(batches[0])
        loss = losses["loss"]
    else:
        loss, losses, _ = model.loss_backward(batches)
        model.optimizer_step()
    model.datamodule.after_update(None)
    return loss, losses


def categorical_log_prob_and_entropy(actor: list[nn.Module], batch: dict, *_: Any) -> tuple[torch.Tensor, ...]:
    """The taken actions' log-probabilities under the logits, and the distribution's entropy, per sample."""
    log_probs = F.log_softmax(actor[0](batch["observation"]), -1)
    log_prob = log_probs.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    return log_prob, -(log_probs.exp() * log_probs).sum(-1)


def gaussian_log_prob_and_entropy(
    actor: list[nn.Module], batch: dict, squash: bool, bounds: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, ...]:
    """The taken actions' log-densities under the Gaussian, and its entropy (for the tanh-normal, estimated from one
    reparameterised sample, as TorchRL's loss does), per sample."""
    loc, scale = actor[0](batch["observation"])
    for layer in actor[1:]:  # the box's units (normal on a bounded box)
        loc, scale = layer(loc, scale)
    normal = torch.distributions.Normal(loc, scale)
    if not squash:
        return normal.log_prob(batch["action"]).sum(-1), normal.entropy().sum(-1)
    low, high = bounds
    centre, half_range = (high + low) / 2, (high - low) / 2

    def log_density(u: torch.Tensor) -> torch.Tensor:  # of centre + half_range · tanh(u): the Jacobian's log
        log_det = half_range.log() + 2 * (math.log(2) - u - F.softplus(-2 * u))
        return (normal.log_prob(u) - log_det).sum(-1)

    unit = ((batch["action"] - centre) / half_range).clamp(-1 + 1e-6, 1 - 1e-6)
    return log_density(torch.atanh(unit)), -log_density(normal.rsample())
