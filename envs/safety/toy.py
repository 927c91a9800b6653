"""The PIRL authors' 2-D toy system as a batched TorchRL environment: a tiny, fast safety task for tests.

State ``(x₁, x₂, τ)``; the controlled diffusion ``dx = f(x, u) dt + σ dW`` with drift ``f = (−x₁³ − x₂, x₁ + x₂ + u)``
(:class:`envs.safety.physics.ToyPhysics`, which the PDE loss also uses), σ = 0.4 on both coordinates,
integrated by Euler–Maruyama steps of ``dt``. Unsafe when ``|x₂| > 1``; reward 1 when the horizon
τ ~ U(0, ``tau_max``) runs out in the safe set. Actions pick ``u`` from ``controls``.
"""

from __future__ import annotations

import torch

from envs.safety.base import SafetyEnv
from envs.safety.physics import ToyPhysics


class ToyEnv(SafetyEnv):
    """Batched 2-D toy safety task.

    Args:
        num_envs: environments stepped together.
        controls: the values of ``u``, one action each.
        sigma: diffusion coefficient on x₁ and x₂.
        tau_max: horizons are drawn from U(0, tau_max) s.
        dt: seconds per step.
        seed: base seed; environment ``i`` draws from stream ``seed + i``.
        device: where the batch lives.
        compile_step: the step and reset each compiled into one graph (:class:`~envs.base.BatchedEnv`).
    """

    initial_draws = 3
    noise_dims = 2

    def __init__(
        self,
        num_envs: int = 1,
        controls: tuple[float, ...] = (-1.0, 0.0, 1.0),
        sigma: float = 0.4,
        tau_max: float = 1.0,
        dt: float = 0.05,
        seed: int = 0,
        device: str | torch.device = "cpu",
        compile_step: bool = False,
    ) -> None:
        if len(controls) < 2:
            raise ValueError(f"controls must list at least 2 values of u, got {controls}")
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        super().__init__(num_envs, 3, len(controls), dt, tau_max, seed, device, compile_step)
        self.controls, self.sigma = tuple(controls), sigma
        #: the dynamics and collocation domain the PIRL loss uses: the same model as this environment.
        self.physics = ToyPhysics(controls=self.controls, tau_max=tau_max)

    def _initial_state(self, uniforms: torch.Tensor) -> dict[str, torch.Tensor]:
        x1 = 1.5 * (2 * uniforms[:, 0] - 1)
        x2 = 0.9 * self.physics.bound * (2 * uniforms[:, 1] - 1)
        return {"state": torch.stack((x1, x2, self.tau_max * uniforms[:, 2]), 1)}

    def _advance(self, action: torch.Tensor, noise: torch.Tensor) -> None:
        rates = self.physics.drift(self.state, action)
        self.state[:, :2] += self.dt * rates[:, :2] + (self.sigma * self.dt**0.5) * noise

    def _unsafe(self) -> torch.Tensor:
        return self.state[:, 1].abs() > self.physics.bound
