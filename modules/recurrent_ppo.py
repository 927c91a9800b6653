"""PPO with a recurrent (LSTM) policy, trained by truncated back-propagation through time on sequence segments.

Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347, 2017; the recurrent form as in
Metta's trainer and CleanRL's ``ppo_atari_lstm``: one network (token encoder → LSTM → action and value heads), the
LSTM state carried from step to step while acting and reset where an episode starts, and minibatches of whole
segments of ``bptt`` steps that start from the state stored at their first step.

The pieces are TorchRL's: ``LSTMModule`` keeps its state in the TensorDict (``recurrent_state_h``/``_c``) and
resets it where ``is_init`` is set; the environment carries the ``InitTracker`` and the state primer
(:meth:`RecurrentPPO.env_transform`, which the data module applies to every environment it builds), so the collector
stores each step's input state and carries the state across collector calls (and checkpoints, with the rest of the
collector's carrier). An update runs the trunk (encoder and LSTM) with ``set_recurrent_mode(True)`` over
``[segments, bptt]`` minibatches (the data module's ``bptt`` option cuts them), then ``ClipPPOLoss`` on the heads.

Usage::

    python -m app fit --config configs/metta_ppo.yaml
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.data import TensorSpec
from torchrl.envs import Compose, InitTracker, Transform
from torchrl.modules import LSTMModule, ValueOperator, set_recurrent_mode
from torchrl.objectives.value.functional import vec_generalized_advantage_estimate

from datamodules.source import DataSource
from modules.actors import CategoricalActor
from modules.base import RLModule
from modules.networks import TokenEncoder
from modules.optim import OptimizerOptions
from modules.ppo import PPOLossOptions, check_advantage_options, clip_ppo_loss, decay_clip, ppo_batch_keys, ppo_update

_STATE_KEYS = ("recurrent_state_h", "recurrent_state_c")


@dataclass(frozen=True)
class RecurrentNetworkOptions:
    """The recurrent network's sizes: ``network:`` in a RecurrentPPO's ``init_args``.

    Args:
        lstm_hidden: the LSTM's hidden size (128; 256 in the ultra-fast preset).
        trunk_features: width of the two linear layers between the convolutions and the LSTM.
        grid_features: feature channels of the token grid; at least the environment's number of observation
            features (checked when training starts).
        grid_size: the view's side in cells (MettaGrid: 13, or ``obs.width``).
    """

    lstm_hidden: int = 128
    trunk_features: int = 128
    grid_features: int = 64
    grid_size: int = 13

    def __post_init__(self) -> None:
        for name in ("lstm_hidden", "trunk_features", "grid_features"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.network.{name} must be > 0, got {getattr(self, name)}")
        if not 5 <= self.grid_size <= 16:
            raise ValueError(f"model.network.grid_size must be in [5, 16] (a packed token cell), got {self.grid_size}")


#: Where a checkpoint written while the loss ran the trunk (before 2026-12-01) holds the loss's actor: the trunk
#: (``0.``, the same weights as the model's ``trunk.``) and the actor head (``1.module.``, now the loss's whole actor).
_FORMER_LOSS_ACTOR = "loss_module.actor_network_params.module.0.module."


def forget_trunk_in_loss(state_dict: dict[str, Any]) -> None:
    """A checkpoint's weights in the loss's layout of today, in place: the loss's copy of the trunk's weights dropped,
    its actor head's renamed. A migration with an end: it goes in app.errors.FORMER_NAMES_REMOVED_IN."""
    if not any(key.startswith(f"{_FORMER_LOSS_ACTOR}0.") for key in state_dict):
        return
    for key in [key for key in state_dict if key.startswith(_FORMER_LOSS_ACTOR)]:
        value = state_dict.pop(key)
        if key.startswith(f"{_FORMER_LOSS_ACTOR}1.module."):
            state_dict[_FORMER_LOSS_ACTOR + key.removeprefix(f"{_FORMER_LOSS_ACTOR}1.module.")] = value


class RecurrentPPO(RLModule):
    """Clipped PPO with a token-grid CNN, an LSTM and action and value heads on its output
    (docs/reference_systems.md §5).

    Args:
        observation_spec: linked from the data module (token observations ``[num_tokens, 3]`` uint8).
        action_spec: linked from the data module (a discrete ``Categorical`` spec, one agent's).
        network: the token grid, trunk and LSTM's sizes (:class:`RecurrentNetworkOptions`).
        gamma: discount.
        gae_lambda: GAE's λ.
        loss: the clipped objective's terms (:class:`~modules.ppo.PPOLossOptions`; here a clip of 0.1).
        optimizer, compile, check_finite_every: see :class:`~modules.base.RLModule` (here Adam 3e-4, the gradient's norm
            clipped at 0.5).
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        network: RecurrentNetworkOptions = RecurrentNetworkOptions(),
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        loss: PPOLossOptions = PPOLossOptions(clip_epsilon=0.1),
        optimizer: OptimizerOptions = OptimizerOptions(lr=3e-4, max_grad_norm=0.5),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__(observation_spec, action_spec, optimizer, compile, check_finite_every)
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        check_advantage_options(gamma, gae_lambda)
        self.gamma, self.gae_lambda, self.loss_options = gamma, gae_lambda, loss

        grid_size, lstm_hidden = network.grid_size, network.lstm_hidden
        self.encoder = TokenEncoder(network.grid_features, grid_size, grid_size, network.trunk_features)
        self.lstm = LSTMModule(
            input_size=network.trunk_features, hidden_size=lstm_hidden, in_key="embed", out_key="hidden"
        )
        self.trunk = TensorDictSequential(TensorDictModule(self.encoder, ["observation"], ["embed"]), self.lstm)
        self.actor_head = nn.Linear(lstm_hidden, action_spec.space.n)
        self.value_head = nn.Linear(lstm_hidden, 1)
        self.actor = CategoricalActor(
            TensorDictSequential(self.trunk, TensorDictModule(self.actor_head, ["hidden"], ["logits"])), action_spec
        )
        # The critic is the value head alone, on the LSTM output the actor's pass wrote into the batch.
        self.critic = ValueOperator(self.value_head, in_keys=["hidden"])
        # The loss is the heads' on the trunk's output: an update runs the trunk once per minibatch, and the policy and
        # value losses both train it through its output. The encoder and the heads' loss compile, the LSTM between
        # them runs eagerly (compiled_loss): where an episode starts inside a segment, its "pad" backend splits the
        # segment there and pads the pieces, shapes that depend on the data, so a compiled LSTM was a new graph for
        # every layout of resets (its "scan" backend has a backward that does not compile with torch 2.13), and an
        # eager one inside one compiled loss broke it into dozens of Dynamo frames. Eager, the LSTM runs its fused
        # kernel as in acting; the encoder compiles, which on a CPU is a little faster than its eager (channels-last)
        # convolutions at an update's size.
        heads = CategoricalActor(TensorDictModule(self.actor_head, ["hidden"], ["logits"]), action_spec)
        self.loss_module = clip_ppo_loss(heads, self.critic, loss)

    # ------------------------------------------------------------------------------------------------ acting
    def policy(self) -> TensorDictModuleBase:
        # The value comes with each action, for GAE (postprocess): the collector stores it.
        return TensorDictSequential(self.actor, self.critic)

    def greedy_policy(self) -> TensorDictModuleBase:
        # Under ExplorationType.DETERMINISTIC (evaluation) the actor takes the distribution's mode; an evaluation
        # reads the action only.
        return self.actor.without_log_prob()

    def env_transform(self) -> Transform:
        """``is_init`` at every episode start, and the LSTM state in every reset (zeros) and step of the env."""
        return Compose(InitTracker(), self.lstm.make_tensordict_primer())

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        """Segments to train on, and a grid that holds the environment's token layout."""
        super().check_datamodule(datamodule, cannot_capture)
        if not datamodule.bptt:
            raise ValueError("--model RecurrentPPO trains on sequence segments: set data.bptt (a rollout data module)")
        layout = datamodule.declared.observation_layout
        if layout is None:
            raise ValueError(
                "--model RecurrentPPO reads token observations: the environment must describe them (observation_layout"
                ", as envs.mettagrid.env.MettaGridEnv and envs.testing.recall.CueRecallEnv do)"
            )
        grid, features = self.encoder.grid, layout.num_features
        if features > grid.num_features:
            raise ValueError(
                f"model.network.grid_features {grid.num_features} is too small for this environment's "
                f"{features} observation features"
            )
        if (layout.height, layout.width) != (grid.height, grid.width):
            raise ValueError(
                f"model.network.grid_size {grid.height} does not match the environment's "
                f"{layout.height}x{layout.width} view"
            )

    def setup(self, stage: str) -> None:
        self.connect_datamodule(stage, env_transform=self.env_transform())
        if stage == "fit":
            self._take_feature_scale(self.datamodule.declared.observation_layout.scale)

    def _take_feature_scale(self, feature_scale: Any) -> None:
        """The environment's per-feature value scale into the grid (saved with the weights, so a checkpoint decodes
        tokens as it was trained to)."""
        scale = torch.as_tensor(feature_scale, dtype=torch.float32)
        grid = self.encoder.grid
        grid.scale[: len(scale)] = scale
        grid.scale[len(scale) :] = 0  # channels the environment never fills, and the slot for padding

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        forget_trunk_in_loss(checkpoint.get("state_dict", {}))
        super().on_load_checkpoint(checkpoint)

    # ------------------------------------------------------------------------------------------------ update
    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """The PPO loss on ``[segments, bptt]``: the LSTM runs through each segment from its stored first state."""
        return self.heads_loss(self.run_trunk(batch))

    def run_trunk(
        self, batch: TensorDictBase, encode: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> TensorDictBase:
        """A copy of the batch with the trunk's output (``hidden``) of every step of its segments; ``encode``: the
        encoder to run (the compiled one)."""
        batch = batch.copy()
        batch["embed"] = (encode or self.encode)(batch["observation"])
        with set_recurrent_mode(True):
            return self.lstm(batch)

    def encode(self, observation: torch.Tensor) -> torch.Tensor:
        """The token encoder's embedding of observations."""
        return self.encoder(observation)

    def trainable_parameters(self) -> list[nn.Parameter]:
        # The loss module holds the heads; the trunk runs before it (in the order the loss's actor held them, which
        # optimizer states of checkpoints count on).
        return [*self.trunk.parameters(), *super().trainable_parameters()]

    def heads_loss(self, batch: TensorDictBase) -> TensorDictBase:
        """The clipped objective, the entropy bonus and the value loss of a batch that holds the trunk's output."""
        return self.loss_module(batch)

    def compiled_loss(self) -> Callable[[TensorDictBase], TensorDictBase]:
        # The encoder and the heads' loss compiled, the LSTM between them eager (see __init__).
        encode, heads_loss = self.compiled(self.encode), self.compiled(self.heads_loss)
        return lambda batch: heads_loss(self.run_trunk(batch, encode))

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        """PPO's update (:func:`~modules.ppo.ppo_update`) on ``[segments, bptt]`` minibatches."""
        return ppo_update(self, batches)

    @torch.no_grad()
    def postprocess(self, rollout: TensorDictBase) -> None:
        """GAE along the time dimension (the last) of the ``[*envs, steps]`` rollout, in place (and the clip of this
        rollout's updates, with ``loss.clip_decay_frames``).

        The values are those the policy computed while acting. A step's next value is the following step's value,
        except where that step starts a new episode or lies beyond the rollout: there it is the value of the next
        observation under the ending episode's own LSTM state, one extra step of the network for just those entries.
        """
        if self.loss_options.clip_decay_frames is not None:
            decay_clip(self.loss_module, self.loss_options, self.datamodule.frames + rollout.numel())
        steps = rollout.shape[-1]
        td = rollout.reshape(-1, steps)
        value = td["state_value"]
        done, terminated, reward = td["next", "done"], td["next", "terminated"], td["next", "reward"]
        next_value = torch.empty_like(value)
        next_value[:, :-1] = value[:, 1:]
        boundary = done.squeeze(-1).clone()
        boundary[:, -1] = True
        after = td["next"][boundary].select("observation", *_STATE_KEYS)
        after["is_init"] = torch.zeros(after.shape + (1,), dtype=torch.bool, device=after.device)
        # Under bf16 autocast (the training step's) the extra step computes in bf16, while values acted in worker
        # processes, which run without autocast, are float32: store it in the rollout's dtype.
        next_value[boundary] = self.critic(self.trunk(after))["state_value"].to(next_value.dtype)
        advantage, value_target = vec_generalized_advantage_estimate(
            self.gamma, self.gae_lambda, value, next_value, reward, done, terminated, time_dim=-2
        )
        rollout["advantage"] = advantage.reshape(*rollout.shape, 1)
        rollout["value_target"] = value_target.reshape(*rollout.shape, 1)

    def batch_keys(self) -> list:
        trunk_inputs = [key for key in self.trunk.in_keys if key not in self.trunk.out_keys]
        heads_inputs = [key for key in ppo_batch_keys(self.loss_module) if key not in self.trunk.out_keys]
        return list(dict.fromkeys([*trunk_inputs, *heads_inputs]))
