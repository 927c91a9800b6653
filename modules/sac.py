"""Soft actor-critic (docs/reference_systems.md §4): a tanh-Gaussian actor and twin Q critics on TorchRL's ``SACLoss``.

The actor maps the observation through an MLP (the reference's hidden layers 128, 64) to the location and scale of a
Gaussian whose sample is squashed by tanh onto the action box (TorchRL's ``TanhNormal``); acting samples it,
evaluation and export take its deterministic action ``centre + half_range · tanh(location)``, the same form as the
behaviour-cloning policy (:class:`~modules.networks.ScaledTanhPolicy`). Two Q-networks (``[observation, action] → 128 →
64 → 1``) with Polyak-averaged target copies, the clipped double-Q target, and the entropy coefficient α tuned
towards a target entropy (−action dims by default), as in Haarnoja et al. 2018 and the reference's Stable-Baselines3
SAC.

``actor_init`` starts the actor from a behaviour-cloning run: its hidden layers, and its output layer as the
Gaussian's location, so the deterministic action is the clone's from the first step; the scale starts at
``actor.init_scale`` everywhere and the critics start from scratch. It takes a BC checkpoint, or a BC config: an earlier
stage, which ``python -m app fit`` runs first (or reuses its finished run: app/stages.py) and replaces with that
stage's checkpoint before training starts. The model itself only ever reads checkpoints.

Usage::

    python -m app fit --config configs/racing_sac.yaml                        # BC stage (or its reuse), then SAC
    python -m app fit --config configs/racing_sac.yaml --config configs/bench/sac_scratch.yaml   # SAC from scratch
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictModuleBase
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs.utils import ExplorationType
from torchrl.objectives import SACLoss, SoftUpdate

from datamodules.source import DataSource
from modules.actors import TanhNormalActor
from modules.base import RLModule
from modules.gaussian import tanh_gaussian_sample
from modules.networks import CriticOptions, ScaledTanhPolicy, check_widths, map_tree, mlp, parameter_tree, q_critic
from modules.optim import OptimizerOptions
from modules.spaces import BOX, check_action_space, check_bounded, check_flat_observation, model_name, observation_entry

ACTOR_INIT = "model.actor_init"


class Location(nn.Module):
    """The location half of the actor's ``[location, scale]`` output."""

    def forward(self, output: torch.Tensor) -> torch.Tensor:
        return output.chunk(2, -1)[0]


class CloneCorrection(nn.Module):
    """``observation → [location, scale]`` of an actor that corrects a frozen clone: the clone's location plus
    ``bound · tanh(correction)``, and the correction network's scale. Where the clone saturates tanh (full throttle,
    full brake) a bounded correction cannot undo it."""

    def __init__(self, clone: nn.Module, correction: nn.Module, bound: float):
        super().__init__()
        self.clone, self.correction, self.bound = clone, correction, bound

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            clone_location = self.clone(observation).chunk(2, -1)[0]
        location, scale = self.correction(observation).chunk(2, -1)
        return torch.cat([clone_location + self.bound * torch.tanh(location), scale], -1)


@dataclass(frozen=True)
class ActorOptions:
    """The actor: ``actor:`` in a SAC's ``init_args``.

    Args:
        hidden_sizes: widths of the actor's hidden layers (the reference's 128, 64).
        lr: the actor's own learning rate; None: ``optimizer.lr``, the critics' and α's. Lower keeps an actor started
            from behaviour cloning within reach of what its critics have seen while they catch up.
        init_scale: the Gaussian's scale (before tanh, in [−1, 1] action units) where the scale layer outputs 0.
        warmup_updates: updates at the start that train the critics (and α) but not the actor. An actor started from
            behaviour cloning would otherwise follow the gradients of critics that know nothing yet, and unlearn its
            driving before they do.
        correction_bound: None: the actor is the whole network. A number: the actor is the clone (``actor_init``),
            frozen, plus a learned correction of its Gaussian's location within ± this bound (before tanh,
            :class:`CloneCorrection`). Training data covers only the states the actor visits; on a state it never
            reached (a corner sharper than any it trained on) a free actor acts on whatever its network extrapolates,
            while a bounded one stays within the bound of the clone, which learned from an expert that drove there.
    """

    hidden_sizes: Sequence[int] = field(default=(128, 64), metadata={"formerly": "actor_hidden_sizes"})
    lr: float | None = field(default=None, metadata={"formerly": "actor_lr"})
    init_scale: float = 1.0
    warmup_updates: int = field(default=0, metadata={"formerly": "actor_warmup_updates"})
    correction_bound: float | None = None

    def __post_init__(self) -> None:
        check_widths("model.actor.hidden_sizes", self.hidden_sizes)
        if self.correction_bound is not None and not self.correction_bound > 0:
            raise ValueError(f"model.actor.correction_bound must be > 0 (or null), got {self.correction_bound}")
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"model.actor.lr must be > 0 (or null for optimizer.lr), got {self.lr}")
        if not self.init_scale > 0:
            raise ValueError(f"model.actor.init_scale must be > 0, got {self.init_scale}")
        if self.warmup_updates < 0:
            raise ValueError(f"model.actor.warmup_updates must be >= 0, got {self.warmup_updates}")


@dataclass(frozen=True)
class BCTermOptions:
    """The behaviour-cloning term: ``bc_term:`` in a SAC's ``init_args``.

    ``weight · |tanh(μ(s)) − tanh(μ_clone(s))|²`` over the batch's states, in [−1, 1] action units, keeps the actor's
    deterministic action near the clone's it started from (``actor_init``), as demonstration-augmented policy
    gradients do (Rajeswaran et al. 2018). The critics start from scratch, and until they know the clone's
    neighbourhood, their action gradients lead the actor off the track; the term holds it there and fades.

    Args:
        weight: the term's weight at frame 0; 0: plain SAC.
        frames: frames over which the weight falls linearly to ``weight_end``.
        weight_end: the weight the term keeps after ``frames`` (0: the tether is gone). A floor keeps a weaker hold on
            the actor for the rest of the run: free of it, the actor follows the critics off the road.
    """

    weight: float = field(default=0.0, metadata={"formerly": "bc_weight"})
    frames: int = field(default=500_000, metadata={"formerly": "bc_weight_frames"})
    weight_end: float = field(default=0.0, metadata={"formerly": "bc_weight_end"})

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"model.bc_term.weight must be >= 0, got {self.weight}")
        if not 0 <= self.weight_end <= self.weight:
            raise ValueError(f"model.bc_term.weight_end must be in [0, weight = {self.weight}], got {self.weight_end}")
        if self.frames < 1:
            raise ValueError(f"model.bc_term.frames must be >= 1, got {self.frames}")


class SAC(RLModule):
    """SAC with twin (or ``critics.count``) Q critics, Polyak target critics and automatic entropy tuning (or a fixed
    α).

    Args:
        observation_spec: linked from the data module (``observation`` is a flat vector).
        action_spec: linked from the data module: a Box whose every dimension is bounded (any bounds: asymmetric,
            per dimension), which the tanh-Gaussian's actions are rescaled onto. An unbounded Box is one error line
            (a squashed Gaussian has no box to squash into): PPO's normal distribution acts there.
        actor: the actor's network and start (:class:`ActorOptions`).
        critics: the Q critics and their targets (:class:`CriticOptions`).
        gamma: discount.
        alpha_init: the entropy coefficient α at the start.
        learn_alpha: tune α towards ``target_entropy`` (automatic entropy tuning); false: α stays ``alpha_init``
            (the RL Zoo's numeric ``ent_coef``).
        target_entropy: the entropy α steers the policy towards; ``auto``: −(action dims).
        actor_init: None (a randomly initialised actor), a behaviour-cloning checkpoint (``.ckpt``) whose network
            has this actor's layer sizes, or a behaviour-cloning config (``.yaml``) that ``python -m app fit`` runs
            first as its own stage (or reuses when that stage already finished) and replaces with the stage's
            checkpoint (``stage_options``; app/stages.py). Ignored when a run resumes. With it the Gaussian's scale
            starts at ``actor.init_scale`` everywhere.
        bc_term: a term in the actor's loss that keeps it near the clone it started from (:class:`BCTermOptions`).
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule` (the reference: Adam 3e-4,
            unclipped).
    """

    # Options that may name an earlier stage's config instead of its checkpoint: the app runs that stage and sets the
    # attribute of the same name to the stage's checkpoint before fit starts.
    stage_options = ("actor_init",)

    target_networks = ("qvalue_network",)

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        actor: ActorOptions = ActorOptions(),
        critics: CriticOptions = CriticOptions(),
        gamma: float = 0.99,
        alpha_init: float = 1.0,
        learn_alpha: bool = True,
        target_entropy: float | str = "auto",
        actor_init: str | None = None,
        bc_term: BCTermOptions = BCTermOptions(),
        optimizer: OptimizerOptions = OptimizerOptions(lr=3e-4),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(observation_spec, action_spec, optimizer, compile, check_finite_every)
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        if not 0 <= gamma <= 1:
            raise ValueError(f"model.gamma must be in [0, 1], got {gamma}")
        if not alpha_init > 0:
            raise ValueError(f"model.alpha_init must be > 0, got {alpha_init}")
        if target_entropy != "auto" and not isinstance(target_entropy, int | float):
            raise ValueError(f"model.target_entropy must be a number or auto, got {target_entropy!r}")
        if actor_init is not None and Path(actor_init).suffix not in (".ckpt", ".yaml", ".yml"):
            raise ValueError(
                f"{ACTOR_INIT} must be a behaviour-cloning checkpoint (.ckpt) or config (.yaml): {actor_init!r}"
            )
        if bc_term.weight > 0 and actor_init is None:
            raise ValueError("model.bc_term.weight > 0 needs model.actor_init (the clone it keeps near)")
        if actor.correction_bound is not None and actor_init is None:
            raise ValueError("model.actor.correction_bound needs model.actor_init (the clone it corrects)")
        self.gamma, self.actor_init, self.bc_term, self.tau = gamma, actor_init, bc_term, critics.tau
        self.actor_lr = optimizer.lr if actor.lr is None else actor.lr
        self.actor_warmup_updates = actor.warmup_updates
        observation_dim = check_flat_observation(self, observation_entry(self, observation_spec))
        check_action_space(self, action_spec, (BOX,))
        # Any bounded box: the tanh-Gaussian is rescaled onto it, dimension by dimension (TanhNormal's low and high).
        squashes = f"--model {model_name(self)} squashes its actions into a bounded box (tanh)"
        low, high = check_bounded(action_spec, squashes, "use modules.ppo.PPO (gaussian.distribution normal)")
        (action_dim,) = action_spec.shape

        # Location and scale from one MLP; the scale through softplus shifted so that an output of 0 gives init_scale.
        network = self.make_actor_network(observation_dim, actor.hidden_sizes, 2 * action_dim)
        # The clone the actor starts from (a frozen copy, filled by load_behaviour_cloning): what the BC term keeps the
        # actor near, or what a bounded actor corrects.
        self.clone_network = copy.deepcopy(network).requires_grad_(False)
        self.corrects_clone = actor.correction_bound is not None
        if self.corrects_clone:
            network = CloneCorrection(self.clone_network, network, actor.correction_bound)
        # TorchRL's ProbabilisticActor over a TanhNormal, acting without building the distribution (modules/actors.py).
        self.actor = TanhNormalActor(
            TensorDictModule(
                nn.Sequential(
                    network,
                    NormalParamExtractor(scale_mapping=f"biased_softplus_{actor.init_scale}", scale_lb=1e-4),
                ),
                in_keys=["observation"],
                out_keys=["loc", "scale"],
            ),
            action_spec,
            low,
            high,
            # safe_tanh clamps inside tanh's inverse, which torch.compile cannot trace; the loss scores the exact
            # pre-tanh sample (rsample_and_log_prob), so the inverse is never taken in training.
            distribution_kwargs={"safe_tanh": False},
            default_interaction_type=ExplorationType.RANDOM,
        )
        # The BC term's weight now: a tensor the compiled loss reads, set from the frame counter before each update.
        self.register_buffer("bc_weight", torch.tensor(float(bc_term.weight)))
        self.qvalue = self.make_critic(observation_dim, critics.hidden_sizes, low, high)
        # TorchRL's SACLoss holds the critics (their parameters stacked), their target copies, log α and the target
        # entropy, and defines the losses; the update computes them from its parameters (:meth:`loss`).
        self.loss_module = self.make_loss_module(
            num_qvalue_nets=critics.count,
            alpha_init=alpha_init,
            fixed_alpha=not learn_alpha,  # log α a buffer: its loss is computed, as SACLoss's, and moves nothing
            target_entropy=target_entropy,
            action_spec=action_spec,
        )
        self.loss_module.make_value_estimator(gamma=gamma)
        # SACLoss resolves "auto" into a buffer on first use; resolved now, so that a fresh model loads a checkpoint.
        _ = self.loss_module.target_entropy
        if self.target_networks:  # TorchRL's updater of the target critics; the update applies it fused (soft_update)
            self.target_updater = SoftUpdate(self.loss_module, tau=critics.tau)
        # The box the actions are squashed into (not saved: the action spec gives it).
        self.register_buffer("action_centre", (high + low) / 2, persistent=False)
        self.register_buffer("action_half_range", (high - low) / 2, persistent=False)
        if actor_init is not None and Path(actor_init).suffix == ".ckpt":
            self.read_clone(Path(actor_init))  # a wrong file fails now, not after the run has started

    def make_actor_network(self, observation_dim: int, hidden_sizes: Sequence[int], outputs: int) -> nn.Module:
        """The actor's network, ``observation → [location, scale]`` (``outputs`` values)."""
        return mlp(observation_dim, hidden_sizes, outputs)

    def make_critic(
        self, observation_dim: int, hidden_sizes: Sequence[int], low: torch.Tensor, high: torch.Tensor
    ) -> TensorDictModule:
        """One Q critic, ``(observation, action) → Q`` (the loss module stacks ``critics.count`` copies of it)."""
        return q_critic(observation_dim, hidden_sizes, low, high)

    def make_loss_module(self, **options: Any) -> SACLoss:
        """TorchRL's loss module of this agent, over :attr:`actor` and :attr:`qvalue`, with the target critics."""
        return SACLoss(self.actor, self.qvalue, loss_function="l2", delay_qvalue=True, **options)

    @property
    def actor_network(self) -> nn.Module:
        """The actor's network, ``observation → [location, scale before its mapping]``: its MLP, or the clone and its
        bounded correction (:class:`CloneCorrection`)."""
        return self.actor.module[0].module[0]

    def policy(self) -> TensorDictModuleBase:
        return self.actor  # samples: the collector runs under the RANDOM exploration type

    def greedy_policy(self) -> TensorDictModuleBase:
        return self.actor  # evaluation sets the DETERMINISTIC exploration type: centre + half_range · tanh(loc)

    def export_network(self) -> nn.Module:
        space = self.action_spec.space
        # The same form as the behaviour-cloning policy: centre + half_range · tanh(location).
        actor = ScaledTanhPolicy(nn.Sequential(self.actor_network, Location()), space.low.float(), space.high.float())
        return actor.to(self.device)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.actor_critic_optimizer(self.actor_lr)

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        self.check_random_update(datamodule)
        super().check_datamodule(
            datamodule, (*cannot_capture, f"{type(self).__name__}'s random draws inside the update")
        )

    def follow_frames(self) -> None:
        super().follow_frames()
        term = self.bc_term
        progress = min(self.datamodule.frames / term.frames, 1.0)
        self.bc_weight.fill_(term.weight_end + (term.weight - term.weight_end) * (1.0 - progress))

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        """One SAC update: the critics' clipped double-Q loss, the actor's ``α·log π − min Q`` (and its term towards
        the clone), α's loss, their backward, gradient clip and Adam step, then the Polyak step of the target critics.
        During ``actor.warmup_updates`` the actor's terms are computed but held back: it gets no gradient."""
        # From the restored update counter, so a resumed run holds the actor back exactly as long.
        warming_up = self.global_step < self.actor_warmup_updates
        held = frozenset({"loss_actor", "loss_bc"}) if warming_up else frozenset()
        loss, losses, _ = self.loss_backward(batches, held=held)
        self.optimizer_step()
        self.soft_update()
        self.datamodule.after_update(None)
        return loss, losses

    def on_fit_start(self) -> None:
        # After Lightning restored a checkpoint (on resume the actor is the checkpoint's) and before any collection.
        if self.actor_init is not None and self.trainer.ckpt_path is None:
            self.load_behaviour_cloning(self.actor_init)
        super().on_fit_start()

    def compiled_loss(self) -> Callable[[TensorDictBase], TensorDictBase]:
        return self.compiled(self.training_loss())

    def load_behaviour_cloning(self, source: str | Path) -> Path:
        """Copy a behaviour-cloning network into the actor; returns the checkpoint used.

        ``source`` is a BC checkpoint. The hidden layers are copied as they are, the output layer into the location's
        rows; the scale's rows are zeroed (the scale is then ``actor.init_scale`` everywhere). An actor that corrects
        the clone gets the clone's hidden layers and a zero output layer: no correction yet.
        """
        checkpoint = Path(source)
        if checkpoint.suffix in (".yaml", ".yml"):  # a stage config the app did not replace with its checkpoint
            raise ValueError(
                f"{ACTOR_INIT} {checkpoint}: a behaviour-cloning config is run as an earlier stage by "
                "`python -m app fit`, which passes its checkpoint on; a model trained another way needs the .ckpt"
            )
        clone = self.read_clone(checkpoint)
        ours = self.clone_network.state_dict(keep_vars=True)
        output = list(ours)[-2:]  # the last layer's weight and bias
        action_dim = ours[output[0]].shape[0] // 2
        with torch.no_grad():
            for key, parameter in ours.items():
                value = clone[key].to(parameter)
                if key in output:  # location rows from the clone, scale rows zero
                    parameter[:action_dim].copy_(value)
                    parameter[action_dim:].zero_()
                else:
                    parameter.copy_(value)
            if self.corrects_clone:
                correction = self.actor_network.correction
                correction.load_state_dict(self.clone_network.state_dict())
                correction[-1].weight.zero_()
                correction[-1].bias.zero_()
            else:
                self.actor_network.load_state_dict(self.clone_network.state_dict())
        print(f"SAC: actor initialised from behaviour cloning {checkpoint}")
        return checkpoint

    def read_clone(self, checkpoint: Path) -> dict[str, torch.Tensor]:
        """The BC network's weights in ``checkpoint``, checked against this actor's sizes. Raises an error naming
        ``model.actor_init`` for a missing or unreadable file, or a network of other sizes."""
        if not checkpoint.is_file():
            raise ValueError(f"{ACTOR_INIT} {checkpoint}: no such checkpoint file")
        try:
            state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
        except Exception as error:  # a truncated or foreign file: say which flag gave it
            raise ValueError(f"{ACTOR_INIT} {checkpoint}: not a readable Lightning checkpoint ({error})") from None
        prefix = "actor.network."  # modules.bc.BehaviourCloning's network
        clone = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
        ours = self.clone_network.state_dict()
        output = list(ours)[-2:]
        expected = {
            key: torch.Size((value.shape[0] // 2, *value.shape[1:]) if key in output else value.shape)
            for key, value in ours.items()
        }
        found = {key: value.shape for key, value in clone.items()}
        if found != expected:
            raise ValueError(
                f"{ACTOR_INIT} {checkpoint}: its network's layers ({_describe(found)}) do not fit this actor's "
                f"({_describe(expected)}): the observation, model.actor.hidden_sizes and the actions must "
                "match the behaviour-cloning run's"
            )
        return clone

    def training_loss(self) -> Callable[[TensorDictBase], TensorDictBase]:
        """The loss the update compiles and calls: :meth:`loss_near_clone` with a term towards the clone, else
        :meth:`loss`. Another function, not a branch inside one: Dynamo caches compiled code per function, and with
        the guards on the model dropped a branch on the model's options would be decided once for every model in the
        process."""
        return self.loss_near_clone if self.bc_term.weight > 0 else self.loss

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """SAC's losses as TorchRL's ``SACLoss`` defines them, from the parameters it holds: the critics' squared error
        to the clipped double-Q target (the target critics' minimum at a fresh action of the next state, less α·log π,
        discounted unless terminated), the actor's ``α·log π − min Q`` through critics held fixed, and α's loss
        towards the target entropy. ``SACLoss.forward`` returns the same numbers from the same random draws
        (tests/agents/test_sac.py); here every critic runs in one batched matmul a layer
        (:meth:`~modules.networks.QNetwork.ensemble`) and the tanh-Gaussian's density is written out, where its forward
        spends a third of a batch-256 update on a CPU in ``vmap`` and distribution objects (docs/history/gymnasium.md,
        "Against Stable-Baselines3: what changed before the runs of 10:51–18:32")."""
        sac, critic = self.loss_module, self.qvalue.module
        critics = parameter_tree(sac.qvalue_network_params["module"])  # read once, for both passes below
        targets = sac.target_qvalue_network_params["module"]
        alpha = sac.log_alpha.detach().exp()
        observation, action, following = batch["observation"], batch["action"], batch["next"]
        with torch.no_grad():
            next_action, next_log_prob = self.sample(following["observation"])
            next_value = critic.ensemble(targets, following["observation"], next_action).amin(0) - alpha * next_log_prob
            continues = ~following["terminated"].squeeze(-1)
            target = following["reward"].squeeze(-1) + self.gamma * continues * next_value
        loss_qvalue = (critic.ensemble(critics, observation, action) - target).pow(2).sum(0).mean()
        new_action, log_prob = self.sample(observation)
        held = map_tree(torch.Tensor.detach, critics)  # the actor's gradient only
        q = critic.ensemble(held, observation, new_action).amin(0)
        return self.soft_losses(loss_qvalue, log_prob, q, alpha)

    def soft_losses(
        self, loss_qvalue: torch.Tensor, log_prob: torch.Tensor, q: torch.Tensor, alpha: torch.Tensor
    ) -> TensorDictBase:
        """The loss terms of SAC's family from the critics' loss, the log-probability of each fresh action and the
        value ``q`` the actor climbs there: the actor's ``α·log π − q``, α's loss towards the target entropy, α and
        the entropy."""
        log_alpha = self.loss_module.log_alpha
        return TensorDict(
            {
                "loss_actor": (alpha * log_prob - q).mean(),
                "loss_qvalue": loss_qvalue,
                "loss_alpha": -(log_alpha * (log_prob.detach() + self.loss_module.target_entropy)).mean(),
                "alpha": alpha,
                "entropy": -log_prob.detach().mean(),
            },
            batch_size=[],
        )

    def sample(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparametrised action of the actor's tanh-Gaussian for each observation, and its log-probability."""
        location, scale = self.actor.module[0].module(observation)
        noise = torch.randn_like(location)
        return tanh_gaussian_sample(location, scale, noise, self.action_centre, self.action_half_range)

    def loss_near_clone(self, batch: TensorDictBase) -> TensorDictBase:
        """SAC's losses and ``loss_bc``: the actor's deterministic action's squared distance to the clone's."""
        losses = self.loss(batch)
        location = self.actor_network(batch["observation"]).chunk(2, -1)[0]
        with torch.no_grad():
            target = self.clone_network(batch["observation"]).chunk(2, -1)[0]
        losses["loss_bc"] = self.bc_weight * (torch.tanh(location) - torch.tanh(target)).pow(2).sum(-1).mean()
        return losses

    def extra_metrics(self) -> dict[str, torch.Tensor | float]:
        return {"train/log_alpha": self.loss_module.log_alpha.detach(), "train/bc_weight": self.bc_weight}


def _describe(shapes: dict[str, Any]) -> str:
    return ", ".join(f"{key} {list(shape)}" for key, shape in shapes.items()) or "(none)"
