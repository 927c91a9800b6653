"""Network builders shared by the agents. Sizes always come from the environment's specs, never hard-coded."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch
from torch import nn


class FlattenObservation(nn.Module):
    """Flattens the trailing observation dims and casts to float (uint8 boards and frames are stored compactly)."""

    def __init__(self, observation_shape: Sequence[int]) -> None:
        super().__init__()
        self.num_dims = len(observation_shape)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation.flatten(-self.num_dims).float()


def mlp(
    in_features: int,
    hidden_sizes: Sequence[int],
    out_features: int,
    activation: type[nn.Module] = nn.ReLU,
) -> nn.Sequential:
    """``in → hidden... → out`` with ``activation`` between layers and a linear output."""
    layers: list[nn.Module] = []
    for width in hidden_sizes:
        layers += [nn.Linear(in_features, width), activation()]
        in_features = width
    layers.append(nn.Linear(in_features, out_features))
    return nn.Sequential(*layers)


def observation_mlp(observation_shape: Sequence[int], hidden_sizes: Sequence[int], out_features: int) -> nn.Sequential:
    """An MLP reading a whole observation of any shape (e.g. Snake's ``(3, H, W)`` planes, flattened)."""
    return nn.Sequential(
        FlattenObservation(observation_shape),
        mlp(prod(observation_shape), hidden_sizes, out_features),
    )


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
