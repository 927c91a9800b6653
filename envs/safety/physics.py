"""Dynamics of the safety environments, as pure functions of tensors: the one source of truth for the environments
and the PIRL loss.

The environments integrate these functions, and expose them as ``env.physics`` (a :class:`VehiclePhysics` or
:class:`ToyPhysics`); the data module hands that object to the model (``datamodule.physics``), whose PDE loss
(:func:`modules.pde.pde_residual`) differentiates through the same drift ``f(x, a)`` at points of the same
collocation box. Dynamics belong to the environment: nothing here knows about agents or losses.

Two systems:

- :class:`VehiclePhysics`: a dynamic bicycle model with Pacejka tyres (the reference's identified parameters) tracking a
  road, state ``(vx, β, ω, e, ψ, Δx₁…₅, Δy₁…₅, τ)`` in m/s, deg, deg/s, m, deg, m, m, s; 25 actions
  (throttle ``i // 5`` ∈ {0.6 … 1.0}, steer ``i % 5`` ∈ {−0.8 … 0.8} of the 70° maximum steering angle).
- :class:`ToyPhysics`: the authors' 2-D example, state ``(x₁, x₂, τ)``, drift ``(−x₁³ − x₂, x₁ + x₂ + u, −1)``,
  unsafe when ``|x₂| > 1``.

Each also samples its **collocation** points: interior points of the box where the PDE residual is penalised,
terminal points (τ = 0, safe) and unsafe points on the boundary. The vehicle's start states are that same box.

Angles are in degrees in the state (as in the reference's observations and collocation box); the dynamics work in
radians and return degree rates, so units agree (the reference's code mixed the two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# State layout of the vehicle (docs/reference_systems.md §2).
VX, BETA, OMEGA, LATERAL, HEADING = range(5)
WAYPOINTS_X = slice(5, 10)
WAYPOINTS_Y = slice(10, 15)
TAU = 15
VEHICLE_STATE_DIM = 16
THROTTLES = (0.6, 0.7, 0.8, 0.9, 1.0)
STEERS = (-0.8, -0.4, 0.0, 0.4, 0.8)
DEG = 180.0 / math.pi


@dataclass(frozen=True)
class VehicleParameters:
    """The reference's identified model of its CARLA car (``vehicle.audi.tt``): geometry, inertia, tyres, drivetrain."""

    lf: float = 1.34  # m, centre of mass to front axle
    lr: float = 1.3  # m, centre of mass to rear axle
    mass: float = 1265.0  # kg
    yaw_inertia: float = 2093.0  # kg·m²
    bf: float = 5.579  # front Pacejka stiffness factor B
    cf: float = 1.2  # front shape factor C
    df: float = 16000.0  # N, front peak force D
    br: float = 7.579
    cr: float = 1.2
    dr: float = 16000.0
    cm1: float = 550 * (3.45 * 0.919) / 0.34  # N per unit throttle (engine torque × gear ratio / wheel radius)
    cm2: float = 0.0  # N·s/m per unit throttle
    cr0: float = 50.0  # N, rolling resistance
    cr2: float = 0.5  # kg/m, aerodynamic drag
    max_steer_deg: float = 70.0  # steer ±1 ↔ ±70°


def vehicle_controls(action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Throttle and steer (in [−1, 1]) of action indices: throttle ``i // 5``, steer ``i % 5``."""
    throttle = THROTTLES[0] + 0.1 * torch.div(action, 5, rounding_mode="floor").float()
    steer = STEERS[0] + 0.4 * torch.remainder(action, 5).float()
    return throttle, steer


def vehicle_dynamics(
    vx: torch.Tensor,
    beta: torch.Tensor,
    omega: torch.Tensor,
    lateral: torch.Tensor,
    heading: torch.Tensor,
    throttle: torch.Tensor,
    steer: torch.Tensor,
    curvature: torch.Tensor | float = 0.0,
    params: VehicleParameters = VehicleParameters(),
) -> tuple[torch.Tensor, ...]:
    """Time derivatives of ``(vx, β, ω, e, ψ)`` and the speed along the road ``ds/dt``.

    Dynamic bicycle model, rear-wheel drive, Pacejka "magic formula" lateral tyre forces, in the road frame of a
    centre line of the given curvature (1/m, positive turning left). Angles in degrees, rates in deg/s.
    """
    p = params
    # The model is singular at vx → 0; an episode ends below its minimum speed long before that.
    vx = vx.clamp_min(1.0)
    beta, omega, heading = beta / DEG, omega / DEG, heading / DEG
    delta = steer * (p.max_steer_deg / DEG)
    vy = vx * torch.tan(beta)
    # atan rather than atan2: vx > 0 here, and atan2 is several times slower on the CPU.
    alpha_front = delta - torch.atan((vy + p.lf * omega) / vx)
    alpha_rear = torch.atan((p.lr * omega - vy) / vx)
    force_front = p.df * torch.sin(p.cf * torch.atan(p.bf * alpha_front))
    force_rear = p.dr * torch.sin(p.cr * torch.atan(p.br * alpha_rear))
    drive = (p.cm1 - p.cm2 * vx) * throttle - p.cr0 - p.cr2 * vx * vx
    cos_delta, sin_delta = torch.cos(delta), torch.sin(delta)
    dvx = (drive - force_front * sin_delta) / p.mass + vy * omega
    dvy = (force_rear + force_front * cos_delta) / p.mass - vx * omega
    domega = (force_front * p.lf * cos_delta - force_rear * p.lr) / p.yaw_inertia
    dbeta = (vx * dvy - vy * dvx) / (vx * vx + vy * vy)  # d/dt atan(vy / vx)
    cos_psi, sin_psi = torch.cos(heading), torch.sin(heading)
    ds = (vx * cos_psi - vy * sin_psi) / (1.0 - curvature * lateral)
    dlateral = vx * sin_psi + vy * cos_psi
    dheading = omega - curvature * ds
    return dvx, dbeta * DEG, domega * DEG, dlateral, dheading * DEG, ds


def waypoint_curvature(state: torch.Tensor) -> torch.Tensor:
    """Road curvature (1/m) seen in the state's 5 waypoints: heading change of the polyline over its length."""
    dx = state[..., WAYPOINTS_X].diff(dim=-1)
    dy = state[..., WAYPOINTS_Y].diff(dim=-1)
    first, last = torch.atan2(dy[..., 0], dx[..., 0]), torch.atan2(dy[..., -1], dx[..., -1])
    turn = torch.remainder(last - first + math.pi, 2 * math.pi) - math.pi
    # From the middle of the first segment to the middle of the last.
    length = torch.hypot(dx, dy)
    span = length[..., 1:-1].sum(-1) + 0.5 * (length[..., 0] + length[..., -1])
    return turn / span.clamp_min(1e-3)


@dataclass(frozen=True)
class VehiclePhysics:
    """The vehicle as the loss sees it: drift ``f(x, a)`` on the 16-dim state, and the collocation domain.

    Args:
        params: the vehicle model.
        lateral_bound: |e| above it is unsafe (m).
        tau_max: largest horizon sampled (s).
        speed_range, slip_range, yaw_rate_range, heading_range: the interior collocation box
            (docs/reference_systems.md §2).
        interior_margin: interior and terminal points keep |e| below ``interior_margin × lateral_bound``.
    """

    params: VehicleParameters = VehicleParameters()
    lateral_bound: float = 1.0
    tau_max: float = 5.0
    speed_range: tuple[float, float] = (5.0, 20.0)
    slip_range: float = 10.0
    yaw_rate_range: float = 30.0
    heading_range: float = 30.0
    interior_margin: float = 0.95

    state_dim = VEHICLE_STATE_DIM
    num_actions = len(THROTTLES) * len(STEERS)

    def drift(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``f(x, a)``: vehicle rates on the first five dimensions (road curvature read from the waypoints), zero
        drift on the waypoints (the reference's approximation), and ``dτ/dt = −1``."""
        throttle, steer = vehicle_controls(action)
        rates = vehicle_dynamics(*state[..., :5].unbind(-1), throttle, steer, waypoint_curvature(state), self.params)[
            :5
        ]
        zeros = torch.zeros_like(state[..., WAYPOINTS_X])
        tau_rate = torch.full_like(state[..., TAU], -1.0)
        return torch.cat((torch.stack(rates, -1), zeros, zeros, tau_rate.unsqueeze(-1)), dim=-1)

    def _box(self, count: int, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Uniform points in the collocation box; waypoint dimensions copied from rows of ``like`` (replay)."""
        points = like[torch.randint(like.shape[0], (count,), generator=generator).to(like.device)].clone()
        low = torch.tensor(
            [
                self.speed_range[0],
                -self.slip_range,
                -self.yaw_rate_range,
                -self.interior_margin * self.lateral_bound,
                -self.heading_range,
            ],
            device=like.device,
        )
        high = torch.tensor(
            [
                self.speed_range[1],
                self.slip_range,
                self.yaw_rate_range,
                self.interior_margin * self.lateral_bound,
                self.heading_range,
            ],
            device=like.device,
        )
        points[:, :5] = low + (high - low) * _uniform((count, 5), generator, like.device)
        points[:, TAU] = self.tau_max * _uniform((count,), generator, like.device)
        return points

    def collocation(
        self, count: int, replay_states: torch.Tensor, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Interior points (PDE residual), terminal points (τ = 0, safe: V = 1), unsafe points (e = ±bound: V = 0),
        on ``replay_states``' device, drawn from ``generator`` (a CPU one; None: the global generator)."""
        terminal = self._box(count, replay_states, generator)
        terminal[:, TAU] = 0.0
        unsafe = self._box(count, replay_states, generator)
        side = torch.randint(2, (count,), generator=generator).to(unsafe.device) * 2 - 1
        unsafe[:, LATERAL] = side * self.lateral_bound
        return {"interior": self._box(count, replay_states, generator), "terminal": terminal, "unsafe": unsafe}


@dataclass(frozen=True)
class ToyPhysics:
    """The authors' 2-D example: drift ``(−x₁³ − x₂, x₁ + x₂ + u, −1)`` on ``(x₁, x₂, τ)``, unsafe at ``|x₂| > 1``.

    Args:
        controls: the values of ``u`` (one action each).
        bound: |x₂| above it is unsafe.
        x1_range: the interior box is ``|x₁| ≤ x1_range``, ``|x₂| ≤ bound``.
        tau_max: largest horizon sampled (s).
    """

    controls: tuple[float, ...] = (-1.0, 0.0, 1.0)
    bound: float = 1.0
    x1_range: float = 2.0
    tau_max: float = 1.0

    state_dim = 3

    @property
    def num_actions(self) -> int:
        return len(self.controls)

    def drift(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        u = torch.tensor(self.controls, device=state.device, dtype=state.dtype)[action]
        x1, x2 = state[..., 0], state[..., 1]
        return torch.stack((-(x1**3) - x2, x1 + x2 + u, torch.full_like(x1, -1.0)), dim=-1)

    def _box(self, count: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
        scale = torch.tensor([self.x1_range, self.bound], device=device)
        x = (2 * _uniform((count, 2), generator, device) - 1) * scale
        return torch.cat((x, self.tau_max * _uniform((count, 1), generator, device)), dim=1)

    def collocation(
        self, count: int, replay_states: torch.Tensor, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """As :meth:`VehiclePhysics.collocation`."""
        device = replay_states.device
        terminal = self._box(count, device, generator)
        terminal[:, 2] = 0.0
        unsafe = self._box(count, device, generator)
        unsafe[:, 1] = (torch.randint(2, (count,), generator=generator).to(device) * 2 - 1) * self.bound
        return {"interior": self._box(count, device, generator), "terminal": terminal, "unsafe": unsafe}


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """U(0, 1) numbers drawn on the CPU from ``generator`` (None: the global one), then moved to ``device``: one
    generator serves every device, and its state is a CPU tensor a checkpoint carries whatever the device."""
    return torch.rand(shape, generator=generator).to(device)


SafetyPhysics = VehiclePhysics | ToyPhysics
