"""Network builders shared by the agents. Sizes always come from the environment's specs, never hard-coded.

An agent reading one observation picks its network with the ``network`` option group (:class:`NetworkOptions`,
:func:`observation_network`): ``mlp`` flattens the observation, ``nature_cnn`` reads an image (:class:`NatureCNN`),
``auto`` takes the Nature CNN for an image it can read and the MLP for anything else.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn

from compat.tensordict import top_level_entries
from compat.torch import forward_hooks_set, is_batch_norm, own_parameters
from envs.tokens import GLOBAL_LOCATION
from modules.batch_renorm import BatchRenorm
from modules.spaces import SpaceError


class FlattenObservation(nn.Module):
    """Flattens the trailing observation dims and casts to float (uint8 boards and frames are stored compactly)."""

    def __init__(self, observation_shape: Sequence[int]) -> None:
        super().__init__()
        self.num_dims = len(observation_shape)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation.flatten(-self.num_dims).float()


class PlainForward:
    """A network's forward as a chain of its layers' own functions, where it is ``Sequential`` blocks of
    ``FlattenObservation``, ``Linear``, ``ReLU`` and ``Tanh`` (:meth:`of`: None for any other network).

    The same operations on the same tensors as ``network(x)`` (each layer's weights are read at every call, so
    optimizer steps, loaded checkpoints and moves to a device reach it; a forward hook, the network's own or a global
    one, sends the call through the modules, which run it), without ``nn.Module``'s call machinery at each of the
    eight or so modules of a small MLP: for the acting policy of a one-copy loop, which runs it once a frame on one
    row, that machinery cost about as much as the arithmetic (docs/history/gymnasium.md, "The acting network called
    layer by layer, and the target's copy fused")."""

    def __init__(self, network: nn.Module, layers: list[nn.Module]) -> None:
        self.network, self.modules = network, list(network.modules())
        self.steps = [(_PLAIN_LAYERS[type(layer)], layer) for layer in layers]

    @classmethod
    def of(cls, network: nn.Module) -> PlainForward | None:
        layers: list[nn.Module] = []

        def walk(module: nn.Module) -> bool:
            if type(module) is nn.Sequential:
                return all(walk(child) for child in module)
            layers.append(module)
            return type(module) in _PLAIN_LAYERS

        return cls(network, layers) if walk(network) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if forward_hooks_set(self.modules):
            return self.network(x)
        for step, layer in self.steps:
            x = step(layer, x)
        return x


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    parameters = own_parameters(layer)  # not layer.weight: nn.Module.__getattr__'s slow road, twice a layer
    return nn.functional.linear(x, parameters["weight"], parameters["bias"])


def _relu(layer: nn.ReLU, x: torch.Tensor) -> torch.Tensor:
    return torch.relu_(x) if layer.inplace else torch.relu(x)


def _tanh(layer: nn.Tanh, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)


def _flatten(layer: FlattenObservation, x: torch.Tensor) -> torch.Tensor:
    # A flat float32 observation is its own flattening (flatten and float would return the tensor itself).
    return x if layer.num_dims == 1 and x.dtype is torch.float32 else layer.forward(x)


# Module-level functions, so that a policy holding a PlainForward pickles (to a collector worker).
_PLAIN_LAYERS: dict[type, Callable[[Any, torch.Tensor], torch.Tensor]] = {
    nn.Linear: _linear,
    nn.ReLU: _relu,
    nn.Tanh: _tanh,
    FlattenObservation: _flatten,
}


def mlp(
    in_features: int,
    hidden_sizes: Sequence[int],
    out_features: int,
    activation: type[nn.Module] = nn.ReLU,
    normalization: Callable[[int], nn.Module] | None = None,
) -> nn.Sequential:
    """``in → hidden... → out`` with ``activation`` between layers and a linear output; with ``normalization`` (a
    layer of a width), one before every linear layer, as Stable-Baselines3's ``pre_linear_modules`` (CrossQ's)."""
    layers: list[nn.Module] = []
    for index, width in enumerate((*hidden_sizes, out_features)):
        if normalization is not None:
            layers.append(normalization(in_features))
        layers.append(nn.Linear(in_features, width))
        if index < len(hidden_sizes):
            layers.append(activation())
        in_features = width
    return nn.Sequential(*layers)


def observation_mlp(
    observation_shape: Sequence[int],
    hidden_sizes: Sequence[int],
    out_features: int,
    activation: type[nn.Module] = nn.ReLU,
) -> nn.Sequential:
    """An MLP reading a whole observation of any shape (e.g. Snake's ``(3, H, W)`` planes, flattened)."""
    return nn.Sequential(
        FlattenObservation(observation_shape),
        mlp(math.prod(observation_shape), hidden_sizes, out_features, activation),
    )


#: The hidden layers' activation an agent's ``activation`` option names.
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}


def orthogonal_init_(network: nn.Module, output_gain: float) -> nn.Module:
    """Orthogonal weights and zero biases (Saxe et al. 2014), as Stable-Baselines3's ``ortho_init`` and CleanRL's
    ``layer_init`` start a PPO network: gain √2 on every hidden linear and convolutional layer, ``output_gain`` on the
    last layer (0.01 for a policy's logits or mean, so the first policy is near uniform; 1 for a value)."""
    layers = [module for module in network.modules() if isinstance(module, (nn.Linear, nn.Conv2d))]
    with torch.no_grad():
        for layer in layers:
            nn.init.orthogonal_(layer.weight, gain=output_gain if layer is layers[-1] else math.sqrt(2))
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return network


#: The ``network.kind`` choices of an agent reading one observation (DQN adds ``batch_norm_cnn``).
NETWORKS = ("auto", "mlp", "nature_cnn")


def check_widths(name: str, sizes: Sequence[int]) -> None:
    if not sizes or min(sizes) < 1:
        raise ValueError(f"{name} must be widths >= 1, got {list(sizes)}")


@dataclass(frozen=True)
class ActorOptions:
    """An actor of its own network and learning rate: ``actor:`` in a TD3's or a discrete SAC's ``init_args`` (SAC's
    family has its own, :class:`modules.sac.ActorOptions`).

    Args:
        hidden_sizes: widths of the actor's hidden layers.
        lr: the actor's own learning rate; None: ``optimizer.lr``, the critics'.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    lr: float | None = None

    def __post_init__(self) -> None:
        check_widths("model.actor.hidden_sizes", self.hidden_sizes)
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"model.actor.lr must be > 0 (or null for optimizer.lr), got {self.lr}")


@dataclass(frozen=True)
class CriticOptions:
    """The Q critics: ``critics:`` in a SAC's or a TD3's ``init_args``.

    Args:
        hidden_sizes: widths of each critic's hidden layers (the reference's 128, 64).
        count: Q-networks (2: the clipped double-Q of the reference). Their minimum is both the target and what the
            actor climbs, so more critics make both more pessimistic where they disagree: off the states the data
            covers, where an actor that follows a single critic's optimism leaves the road.
        tau: Polyak rate of the target critics.
    """

    hidden_sizes: Sequence[int] = field(default=(128, 64), metadata={"formerly": "critic_hidden_sizes"})
    count: int = field(default=2, metadata={"formerly": "num_critics"})
    tau: float = 0.005

    def __post_init__(self) -> None:
        check_widths("model.critics.hidden_sizes", self.hidden_sizes)
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        if self.count < 1:
            raise ValueError(f"model.critics.count must be >= 1, got {self.count}")
        if not 0 < self.tau <= 1:
            raise ValueError(f"model.critics.tau must be in (0, 1], got {self.tau}")


class QNetwork(nn.Module):
    """``(observation, action) → Q``: an MLP over the observation and the action scaled from its box to [−1, 1];
    ``outputs`` values per pair (1: the Q-value; TQC's: the return's quantiles); ``normalization``: a layer before
    each linear one (CrossQ's batch renormalisation, :mod:`modules.batch_renorm`)."""

    def __init__(
        self,
        observation_dim: int,
        hidden_sizes: Sequence[int],
        low: torch.Tensor,
        high: torch.Tensor,
        outputs: int = 1,
        normalization: Callable[[int], nn.Module] | None = None,
    ):
        super().__init__()
        self.register_buffer("centre", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)
        self.network = mlp(observation_dim + low.numel(), hidden_sizes, outputs, normalization=normalization)

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.network(torch.cat([observation, (action - self.centre) / self.half_range], -1))

    def ensemble(
        self, parameters: TensorDictBase, observation: torch.Tensor, action: torch.Tensor, training: bool = False
    ) -> torch.Tensor:
        """Every critic's Q of a batch ``[batch, ...]`` at once, ``[critics, batch]``: ``parameters`` holds each of
        this network's entries stacked over the critics (``SACLoss``'s ``qvalue_network_params``), and each linear
        layer is one batched matmul over them, what ``vmap`` of :meth:`forward` computes without its Python.
        ``training``: batch renormalisation layers normalise with the batch's statistics and update their running
        ones (CrossQ's critics); else with the running ones."""
        return self.ensemble_outputs(parameters, observation, action, training).squeeze(-1)

    def ensemble_outputs(
        self, parameters: TensorDictBase | dict, observation: torch.Tensor, action: torch.Tensor, training: bool = False
    ) -> torch.Tensor:
        """:meth:`ensemble` with the outputs' dimension kept: ``[critics, batch, outputs]``."""
        parameters = parameter_tree(parameters)
        scaled = (action - parameters["centre"].unsqueeze(-2)) / parameters["half_range"].unsqueeze(-2)
        x = torch.cat([observation.expand(scaled.shape[0], *observation.shape), scaled], -1)
        return ensemble_mlp(self.network, parameters["network"], x, training)


class TargetCopy:
    """A TorchRL loss module's target network as a module of its own: a copy of ``part`` (the Q-network, a submodule
    of the loss's value network) whose parameters and buffers are the target parameters' tensors themselves, so that
    the target updates (``HardUpdate``'s copy, ``SoftUpdate``'s average) and a loaded checkpoint, all in place, reach
    it.

    TorchRL's losses swap the target parameters into the value network for each target pass (``to_module``: a Python
    walk over every parameter on the way in and again on the way out), a noticeable share of a small network's update.
    Calling this gives the copy; it is made again when the target tensors are others (moved to another device or
    dtype), and it follows ``part``'s training mode (BatchNorm moves the target's running statistics in training
    mode, as it does under ``to_module``).
    """

    def __init__(self, loss_module: nn.Module, part: nn.Module) -> None:
        self.loss_module, self.part = loss_module, part
        name = next(name for name, module in loss_module.value_network.named_modules() if module is part)
        self.prefix = tuple(name.split(".")) if name else ()  # where part's entries sit in the target parameters
        self.copy: nn.Module | None = None
        self.leaf: torch.Tensor | None = None  # one of the target tensors the copy holds: all are replaced together
        self.refresh()

    def __call__(self) -> nn.Module:
        if not torch.compiler.is_compiling():  # a compiled loss guards on the copy it was traced with
            self.refresh()
        return self.copy

    def refresh(self) -> None:
        """Make the copy again if the target's tensors are others than those it holds; set its training mode."""
        params = self.loss_module.target_value_network_params
        params = params.get(self.prefix) if self.prefix else params
        if self.copy is None or next(iter(params.values(True, True))) is not self.leaf:
            self.copy = copy.deepcopy(self.part)
            params.to_module(self.copy)  # not as a context: the copy keeps the target's tensors
            self.leaf = next(iter(params.values(True, True)))
        if self.copy.training != self.part.training:
            self.copy.train(self.part.training)

    def __deepcopy__(self, memo: dict) -> TargetCopy:
        # A copied model's loss module is another: its copy is made from that one's target.
        return TargetCopy(copy.deepcopy(self.loss_module, memo), copy.deepcopy(self.part, memo))


def parameter_tree(parameters: TensorDictBase | dict) -> dict[str, Any]:
    """``parameters`` (an ensemble's entries, each stacked over its members: a TorchRL loss module's
    ``qvalue_network_params["module"]``) as nested plain dicts of the same tensors, which :func:`ensemble_mlp` reads
    like the tensordict. Its forward reads a few dozen entries an update, each a tensordict lookup with its checks,
    where a dict's costs next to nothing (docs/history/gymnasium.md, "Replay written and drawn entry by entry, and
    subnormal floats flushed")."""
    if isinstance(parameters, dict):
        return parameters
    entries = top_level_entries(parameters) if type(parameters) is TensorDict else dict(parameters.items())
    return {key: value if isinstance(value, torch.Tensor) else parameter_tree(value) for key, value in entries.items()}


def map_tree(function: Callable[[torch.Tensor], torch.Tensor], tree: dict[str, Any]) -> dict[str, Any]:
    """:func:`parameter_tree`'s ``tree`` with ``function`` applied to each tensor (``torch.Tensor.detach``: the
    critics held fixed for the actor's loss, as ``TensorDict.detach`` holds them)."""
    return {key: map_tree(function, x) if isinstance(x, dict) else function(x) for key, x in tree.items()}


def ensemble_mlp(
    network: nn.Sequential, parameters: TensorDictBase | dict, x: torch.Tensor, training: bool = False
) -> torch.Tensor:
    """:func:`mlp` ``network`` run with an ensemble's weights at once: ``parameters`` holds its entries stacked over
    the ensemble (a TorchRL loss module's ``qvalue_network_params``, or its :func:`parameter_tree`), ``x`` is
    ``[members, batch, features]``, and each linear layer is one batched matmul over the members, what ``vmap`` of the
    network computes without its Python. ``training``: batch renormalisation layers normalise with the batch's
    statistics and update their running ones (CrossQ's critics); else with the running ones."""
    parameters = parameter_tree(parameters)
    for index, layer in enumerate(network):
        entries = parameters[str(index)] if isinstance(layer, nn.Linear | BatchRenorm) else None
        if isinstance(layer, nn.Linear):
            x = torch.baddbmm(entries["bias"].unsqueeze(-2), x, entries["weight"].mT)
        elif isinstance(layer, BatchRenorm):  # each member's own statistics, updated in place when training
            x = layer.ensemble(x, entries, training)
        else:  # the activation, elementwise
            x = layer(x)
    return x


def q_critic(
    observation_dim: int,
    hidden_sizes: Sequence[int],
    low: torch.Tensor,
    high: torch.Tensor,
    outputs: int = 1,
    normalization: Callable[[int], nn.Module] | None = None,
) -> TensorDictModule:
    """A :class:`QNetwork` as the TensorDict module TorchRL's actor-critic losses take: ``observation`` and ``action``
    in, ``state_action_value`` out."""
    return TensorDictModule(
        QNetwork(observation_dim, hidden_sizes, low, high, outputs, normalization),
        in_keys=["observation", "action"],
        out_keys=["state_action_value"],
    )


@dataclass(frozen=True)
class NetworkOptions:
    """What reads an agent's observation: ``network:`` in a model's ``init_args``
    (``--model.init_args.network.hidden_sizes '[64, 64]'``). Each agent's default instance holds its own defaults.

    Args:
        kind: ``mlp`` (an MLP over the flattened observation), ``nature_cnn`` (Mnih et al.'s network for images
            ``[C, H, W]`` or ``[H, W, C]``: :class:`NatureCNN`; ``hidden_sizes`` and ``activation`` are not used),
            ``auto`` (the Nature CNN for uint8 images of at least 36×36, the MLP for anything else, Snake's 10×10
            planes included), or, for DQN only, ``batch_norm_cnn`` (the Mario reference's :class:`BatchNormCNN`).
        hidden_sizes: widths of the MLP's hidden layers.
        activation: the MLP's hidden activation, ``relu`` or ``tanh``.
        orthogonal_init: start the network with orthogonal weights and zero biases (:func:`orthogonal_init_`;
            Stable-Baselines3's ``ortho_init``, CleanRL's ``layer_init``); false: PyTorch's default initialisation.
    """

    kind: Literal["auto", "mlp", "nature_cnn", "batch_norm_cnn"] = field(
        default="auto", metadata={"formerly": "network"}
    )
    hidden_sizes: Sequence[int] = (256, 256)
    activation: Literal["relu", "tanh"] = "relu"
    orthogonal_init: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (*NETWORKS, "batch_norm_cnn"):
            raise ValueError(
                f"model.network.kind must be one of {', '.join(NETWORKS)}, batch_norm_cnn, got {self.kind!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"model.network.activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
            )
        if not all(isinstance(width, int) and width >= 1 for width in self.hidden_sizes):
            raise ValueError(f"model.network.hidden_sizes must be widths >= 1, got {list(self.hidden_sizes)}")
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))  # a config's list, kept immutable

    @property
    def activation_module(self) -> type[nn.Module]:
        return ACTIVATIONS[self.activation]


#: The least height and width the Nature CNN reads: its three convolutions need 36 pixels to leave one.
NATURE_CNN_MIN_SIDE = 36
#: The Nature CNN's features: the width of its hidden linear layer, what heads on it read.
NATURE_CNN_FEATURES = 512


def image_layout(shape: Sequence[int]) -> str | None:
    """How a 3-D observation holds an image: ``chw`` when its first dimension is its smallest (ties too), ``hwc`` when
    its last is, None otherwise (Stable-Baselines3's rule: stacked frames come as ``[C, H, W]``, a Gymnasium
    environment's pixels as ``[H, W, C]``)."""
    if len(shape) != 3:
        return None
    if shape[0] <= min(shape[1], shape[2]):
        return "chw"
    return "hwc" if shape[2] < min(shape[0], shape[1]) else None


def reads_as_image(spec: Any) -> bool:
    """Whether ``network: auto`` reads an observation as an image: uint8 pixels in a layout :func:`image_layout`
    recognises, at least :data:`NATURE_CNN_MIN_SIDE` on each side (Snake's 10×10 planes are read by the MLP)."""
    layout = image_layout(spec.shape)
    if spec.dtype != torch.uint8 or layout is None:
        return False
    height, width = spec.shape[1:] if layout == "chw" else spec.shape[:2]
    return min(height, width) >= NATURE_CNN_MIN_SIDE


def is_nature_cnn(spec: Any, network: str) -> bool:
    """Whether ``network`` (``model.network.kind``) is the Nature CNN for the observation ``spec``."""
    if network not in NETWORKS:
        raise ValueError(f"model.network.kind must be one of {', '.join(NETWORKS)}, got {network!r}")
    return network == "nature_cnn" or (network == "auto" and reads_as_image(spec))


def observation_network(
    spec: Any,
    network: str,
    hidden_sizes: Sequence[int],
    out_features: int | None,
    activation: type[nn.Module] = nn.ReLU,
) -> nn.Module:
    """The network ``network`` names for the observation ``spec``: ``mlp`` (an MLP ``hidden_sizes`` wide over the
    flattened observation, ``activation`` between its layers), ``nature_cnn`` (:class:`NatureCNN`; ``hidden_sizes``
    and ``activation`` are not used; ``out_features`` None: its 512 features, a torso for heads), or ``auto``
    (``nature_cnn`` when :func:`reads_as_image`, else ``mlp``). An observation the network cannot read is a
    :class:`~modules.spaces.SpaceError` naming ``model.network.kind``."""
    if not is_nature_cnn(spec, network):
        return observation_mlp(spec.shape, hidden_sizes, out_features, activation)
    layout = image_layout(spec.shape)
    what = f"{SpaceError.ENV}'s observation is {spec.dtype} of shape {list(spec.shape)}"
    if layout is None:
        raise SpaceError(f"model.network.kind nature_cnn reads images [C, H, W] or [H, W, C]; {what}: use mlp")
    height, width = spec.shape[1:] if layout == "chw" else spec.shape[:2]
    if min(height, width) < NATURE_CNN_MIN_SIDE:
        raise SpaceError(
            f"model.network.kind nature_cnn reads images of at least {NATURE_CNN_MIN_SIDE}x"
            f"{NATURE_CNN_MIN_SIDE} pixels (8x8 stride 4, 4x4 stride 2, 3x3 stride 1); {what}: use mlp"
        )
    return NatureCNN(spec.shape, out_features, channels_last=layout == "hwc", pixels=spec.dtype == torch.uint8)


def as_channels_last(images: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` images (the same values) laid out channels-last in memory, as every CNN here hands them to its
    convolutions: oneDNN's CPU convolutions run much faster on that layout than on NCHW, for MettaGrid's token grids
    and for 84×84 frames (docs/results/mettagrid.md, "Per core against the bare engine"; docs/results/gymnasium.md,
    "The Nature CNN on channels-last images"). Only the activations change layout; the weights keep theirs, so
    checkpoints, optimizer states and the weights collector workers share are as before."""
    # Permutes around a plain copy rather than contiguous(memory_format=...), which vmap does not support (TorchRL's
    # value estimators call networks under vmap); outside vmap the result is the channels-last tensor itself.
    return images.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


class NatureCNN(nn.Module):
    """The DQN network of Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015: images
    ``[..., C, H, W]`` → Conv(32, 8×8, stride 4) → ReLU → Conv(64, 4×4, stride 2) → ReLU → Conv(64, 3×3, stride 1) →
    ReLU → Linear 512 → ReLU → Linear ``out_features``.

    uint8 pixels become floats in [0, 1] (÷ 255) inside the network, so rollouts and replay buffers keep them as bytes;
    a float image is read as it is. A channels-last image ``[..., H, W, C]`` is permuted inside the network too, so
    the environment's layout is the one stored.

    Args:
        observation_shape: one observation's shape, ``(C, H, W)`` (or ``(H, W, C)`` with ``channels_last``).
        out_features: outputs (Q-values or logits per action, a Gaussian's parameters, one value); None: the 512
            features after the hidden linear layer's ReLU (a torso that heads read: :class:`TorsoHead`).
        channels_last: the observation is ``(H, W, C)``.
        pixels: the observation is uint8 pixels, scaled by 1/255.
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        out_features: int | None,
        channels_last: bool = False,
        pixels: bool = True,
    ) -> None:
        super().__init__()
        channels, height, width = (observation_shape[2], *observation_shape[:2]) if channels_last else observation_shape
        self.channels_last, self.scale = channels_last, 1 / 255 if pixels else 1.0
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        flat = self.features(torch.zeros(1, channels, height, width)).shape[-1]
        output = [] if out_features is None else [nn.Linear(NATURE_CNN_FEATURES, out_features)]
        self.head = nn.Sequential(nn.Linear(flat, NATURE_CNN_FEATURES), nn.ReLU(), *output)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        lead = images.shape[:-3]
        x = images.reshape(-1, *images.shape[-3:])
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        # Laid out before the conversion to floats, which keeps the layout: the copy moves bytes, not floats.
        x = as_channels_last(x).float() * self.scale
        return self.head(self.features(x)).reshape(*lead, -1)


class TorsoHead(nn.Sequential):
    """``head(torso(x))``, where the torso is shared with another head (PPO's actor and critic on one Nature CNN, as
    Stable-Baselines3's ``CnnPolicy`` and CleanRL's Atari PPO share it): an update that needs both heads computes the
    torso once (:func:`heads_on_features`)."""

    def __init__(self, torso: nn.Module, head: nn.Module) -> None:
        super().__init__(torso, head)

    @property
    def torso(self) -> nn.Module:
        return self[0]

    @property
    def head(self) -> nn.Module:
        return self[1]


def heads_on_features(
    actor: list[nn.Module], critic: nn.Module, observation: torch.Tensor
) -> tuple[list[nn.Module], nn.Module, torch.Tensor]:
    """``actor`` (its network first), ``critic`` and what they read: when both networks are :class:`TorsoHead` on one
    torso, their heads and the torso's features of ``observation`` (one pass for both); else all three as given."""
    first = actor[0]
    if isinstance(first, TorsoHead) and isinstance(critic, TorsoHead) and first.torso is critic.torso:
        return [first.head, *actor[1:]], critic.head, first.torso(observation)
    return actor, critic, observation


class ScaledTanhPolicy(nn.Module):
    """``observation → action``: the MLP's tanh output mapped from [−1, 1] onto the action box."""

    def __init__(self, network: nn.Module, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__()
        self.network = network
        self.register_buffer("centre", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def unit(self, observation: torch.Tensor) -> torch.Tensor:
        """The action in [−1, 1] units."""
        return torch.tanh(self.network(observation))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.centre + self.half_range * self.unit(observation)

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        return (action - self.centre) / self.half_range


class TokenGrid(nn.Module):
    """Observation tokens → a dense feature grid, one batched scatter (MettaGrid's observation format).

    A token is three bytes ``[location, feature, value]``: ``location`` packs the cell as ``y << 4 | x`` in the
    agent's egocentric view (0xFE: an agent-wide token, such as its last reward, which goes to the agent's own
    cell, the centre), ``feature`` is a feature id and 0xFF in every byte marks padding. The grid is
    ``[features, height, width]`` with ``grid[f, y, x] = value * scale[f]`` (``scale``: the environment's per-feature
    normalisation, so counts, flags and percentages land in similar ranges); cells without a token are 0.

    Every token of the batch is scattered at once into one flat row of ``batch * height * width * features`` cells
    with one extra slot at its end: padding, and anything outside the grid, lands in that slot and is cut off, so no
    mask or Python loop is needed. Two tokens on one cell and feature add up (MettaGrid emits at most one). The cells
    are ordered features last, so the grid comes out laid out channels-last in memory, as the convolutions read it
    (:func:`as_channels_last`), with no copy.

    Args:
        num_features: feature channels (feature ids ``>= num_features`` are dropped).
        height, width: the view's size in cells.
    """

    def __init__(self, num_features: int, height: int, width: int) -> None:
        super().__init__()
        if height > 16 or width > 16:
            raise ValueError(f"a packed token location holds at most 16x16 cells, got {height}x{width}")
        self.num_features, self.height, self.width = num_features, height, width
        # Per-feature value scale, set from the environment (RecurrentPPO.setup); saved with the weights. One extra
        # zero entry for feature ids beyond the grid (padding included).
        self.register_buffer("scale", torch.cat([torch.ones(num_features), torch.zeros(1)]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[..., num_tokens, 3]`` uint8 → ``[..., num_features, height, width]`` float."""
        lead, num_tokens = tokens.shape[:-2], tokens.shape[-2]
        location, feature, value = tokens.reshape(-1, num_tokens, 3).long().unbind(-1)
        centre = (self.height // 2) << 4 | (self.width // 2)
        location = torch.where(location == GLOBAL_LOCATION, centre, location)
        y, x = location >> 4, location & 15
        batch, cells = location.shape[0], self.num_features * self.height * self.width
        inside = (feature < self.num_features) & (y < self.height) & (x < self.width)
        row = torch.arange(batch, device=tokens.device).unsqueeze(-1) * cells
        index = torch.where(inside, row + (y * self.width + x) * self.num_features + feature, batch * cells)
        values = value.to(self.scale.dtype) * self.scale[feature.clamp(max=self.num_features)]
        grid = values.new_zeros(batch * cells + 1).scatter_add_(0, index.flatten(), values.flatten())
        grid = grid[: batch * cells].view(batch, self.height, self.width, self.num_features).permute(0, 3, 1, 2)
        return grid.reshape(*lead, self.num_features, self.height, self.width)


class TokenEncoder(nn.Module):
    """Tokens → grid → Conv(64, k5, s3) → Conv(64, k3) → Linear → Linear (docs/reference_systems.md §5, Metta's policy
    trunk before its LSTM), over any leading batch dimensions (``[batch]`` when acting, ``[segments, bptt]`` when
    training)."""

    def __init__(self, num_features: int, height: int, width: int, out_features: int = 128) -> None:
        super().__init__()
        self.grid = TokenGrid(num_features, height, width)
        self.conv = nn.Sequential(
            nn.Conv2d(num_features, 64, kernel_size=5, stride=3),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3),
            nn.ReLU(),
            nn.Flatten(),
        )
        conv_out = self.conv(torch.zeros(1, num_features, height, width)).shape[-1]
        self.head = nn.Sequential(
            nn.Linear(conv_out, out_features), nn.ReLU(), nn.Linear(out_features, out_features), nn.ReLU()
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        grid = self.grid(tokens)
        lead = grid.shape[:-3]
        return self.head(self.conv(as_channels_last(grid.reshape(-1, *grid.shape[-3:])))).reshape(*lead, -1)


class BatchNormCNN(nn.Module):
    """The Mario reference's Q-network (docs/reference_systems.md §3): uint8 frames ``[..., C, H, W]`` →
    ``[..., out_features]``.

    ``x / 255`` → Conv(32, 8, s4) → BN → ReLU → Conv(64, 4, s2) → BN → ReLU → Conv(64, 3, s1) → BN → ReLU → Linear 512
    → LayerNorm → ReLU → Linear. The convolutions have no bias (BatchNorm's shift replaces it); weights are Kaiming
    (He) initialised for ReLU. BatchNorm normalises with the batch's statistics in training mode and with its running
    averages in eval mode: whoever acts with this network (a collector, an evaluation) must put it in eval mode, or
    each acting batch would move the averages (:class:`EvalModeActor`).

    Args:
        observation_shape: ``(channels, height, width)`` of one observation (stacked frames as channels).
        out_features: outputs (the number of actions for a Q-network).
    """

    def __init__(self, observation_shape: Sequence[int], out_features: int) -> None:
        super().__init__()
        channels, height, width = observation_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.Flatten(),
        )
        flat = self.features(torch.zeros(2, channels, height, width)).shape[-1]
        self.head = nn.Sequential(nn.Linear(flat, 512), nn.LayerNorm(512), nn.ReLU(), nn.Linear(512, out_features))
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.observation_dims = len(observation_shape)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        lead = frames.shape[: -self.observation_dims]
        x = as_channels_last(frames.reshape(-1, *frames.shape[-self.observation_dims :])).float() / 255.0
        return self.head(self.features(x)).reshape(*lead, -1)


def has_batch_norm(network: nn.Module) -> bool:
    """Whether ``network``'s output depends on its train/eval mode through BatchNorm (or batch renormalisation)."""
    return any(is_batch_norm(module) or isinstance(module, BatchRenorm) for module in network.modules())


class EvalModeActor(TensorDictModuleBase):
    """Runs the TensorDict module ``module`` with ``network`` in eval mode, then puts the network's mode back.

    For acting with a network that has BatchNorm while it trains: the collector's forward passes then use the running
    averages and leave them alone, and the update's forward passes (train mode) are unchanged.
    """

    def __init__(self, module: TensorDictModuleBase, network: nn.Module) -> None:
        super().__init__()
        self.module, self.network = module, network
        self.in_keys, self.out_keys = module.in_keys, module.out_keys

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        training = self.network.training
        self.network.eval()
        try:
            return self.module(tensordict)
        finally:
            self.network.train(training)
