"""The inputs on which an export compares traced and eager outputs: random ones, and the environment's own states.

Uniform inputs in [−1, 1] exercise every weight but sit far from what a policy sees: the vehicle's speed is 5–20 m/s
and its yaw rate up to ±30 °/s, where a reduced-precision or mis-compiled kernel errs most. So besides the random
set, an export run with a data module at hand also checks

- ``env_start``: the environment's start distribution, ``datamodule.make_env(copies, seed).reset()["observation"]``
  as the environment gives it (before the agent's env transforms), for up to :data:`ENV_COPIES` copies repeated to
  the batch: an environment with an engine per copy (an Atari emulator: about 0.2 s to build and seed) would
  otherwise build thousands of engines for the traced batch sizes;
- ``collocation``: when the environment exposes its dynamics (``datamodule.declared.physics``), interior points of its
  collocation box (for PIRL's vehicle: vx 5–20 m/s, β ±10°, ω ±30 °/s, e ±0.95 m, ψ ±30°, τ 0–5 s), where the PDE
  loss trained the network.

Each set records the range of what it fed (per feature for vector observations), so ``export.json`` shows which
inputs the equality check really saw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Most environment copies built for one batch of start states; larger batches repeat their rows.
ENV_COPIES = 32

# Per-feature ranges are recorded for vector observations up to this length; larger ones (image planes) get one range.
MAX_FEATURES_RECORDED = 64


def random_inputs(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Observations for the checks: uniform in [-1, 1] for float inputs, 0/1 for integer ones (one-hot or binary
    planes, like Snake's and the chain's)."""
    if dtype.is_floating_point:
        return (torch.rand(tuple(shape), generator=generator) * 2 - 1).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=generator).bool()
    return torch.randint(0, 2, tuple(shape), generator=generator, dtype=dtype)


class CheckInputs:
    """A named source of check observations that remembers the range of everything it produced.

    Args:
        name: the key in ``export.json``'s ``checks`` (``random``, ``env_start``, ``collocation``).
        description: where the observations come from, in words.
        draw: ``(batch, seed) -> observations [batch, *input_shape]`` on the CPU, deterministic in ``seed``.
    """

    def __init__(self, name: str, description: str, draw: Callable[[int, int], torch.Tensor]) -> None:
        self.name, self.description, self.draw = name, description, draw
        self.rows = 0
        self.low: torch.Tensor | None = None
        self.high: torch.Tensor | None = None

    def __call__(self, batch: int, seed: int) -> torch.Tensor:
        observation = self.draw(batch, seed)
        if observation.shape[0] != batch:
            raise ValueError(f"check inputs {self.name!r} gave {observation.shape[0]} rows, not {batch}")
        flat = observation.reshape(batch, -1).double()
        if flat.shape[1] > MAX_FEATURES_RECORDED:
            flat = flat.reshape(-1, 1)
        low, high = flat.amin(0), flat.amax(0)
        self.low = low if self.low is None else torch.minimum(self.low, low)
        self.high = high if self.high is None else torch.maximum(self.high, high)
        self.rows += batch
        return observation

    def summary(self) -> dict[str, Any]:
        """What ``export.json`` records: the description, the rows fed, and their per-feature min and max."""
        low, high = (None, None) if self.low is None else (self.low.tolist(), self.high.tolist())
        return {"description": self.description, "rows": self.rows, "min": low, "max": high}


def random_check_inputs(input_shape: Sequence[int], dtype: torch.dtype) -> CheckInputs:
    """The input-agnostic set: uniform in [-1, 1] (float) or 0/1 (integer), fresh per seed."""
    shape = tuple(input_shape)
    what = "uniform in [-1, 1]" if dtype.is_floating_point else "0 or 1 per element"
    return CheckInputs(
        "random",
        f"random inputs, {what}",
        lambda batch, seed: random_inputs((batch, *shape), dtype, torch.Generator().manual_seed(seed)),
    )


def environment_check_inputs(datamodule: Any) -> list[CheckInputs]:
    """The environment's own observations, from a data module (``make_env``, optional ``physics``); none without one.

    The environments are built with ``datamodule.make_env`` on the data module's device (the CPU unless ``setup``
    moved it) with seeds of their own, so the training environments and the global RNG are left as they were.
    """
    if datamodule is None or not callable(getattr(datamodule, "make_env", None)):
        return []

    def start_states(batch: int, seed: int) -> torch.Tensor:
        copies = min(batch, ENV_COPIES)
        env = datamodule.make_env(copies, seed)
        try:
            # The environment's own observations, before the agent's env transforms: the exported network reads what
            # the environment gives (an observation normaliser is part of it).
            states = getattr(env, "base_env", env).reset()["observation"].cpu()
        finally:
            env.close()
        return states.repeat(-(-batch // copies), *[1] * (states.dim() - 1))[:batch]

    what = f"the environment's start states: make_env(min(batch, {ENV_COPIES}), seed).reset(), repeated to the batch"
    sets = [CheckInputs("env_start", what, start_states)]
    physics = getattr(getattr(datamodule, "declared", None), "physics", None)
    if physics is not None:

        def collocation(batch: int, seed: int) -> torch.Tensor:
            # Start states give the dimensions the box does not draw (the vehicle's waypoints); the box draws the rest
            # from the global RNG, which is forked so that the caller's random stream does not move.
            like = start_states(batch, seed)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return physics.collocation(batch, like)["interior"].to(like.dtype)

        name = type(physics).__name__
        sets.append(CheckInputs("collocation", f"interior points of {name}'s collocation box", collocation))
    return sets
