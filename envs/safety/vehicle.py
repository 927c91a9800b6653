"""The PIRL vehicle as a batched TorchRL environment: thousands of cars on a road, stepped by tensor ops (CPU or CUDA).

The reference drove a CARLA car; CARLA cannot run here, so this environment integrates the same dynamic bicycle model
with Pacejka tyres (:mod:`envs.safety.physics`, which the PDE loss also differentiates) on a synthetic
road and produces the same 16-dimensional state: ``(vx, β, ω, e, ψ, Δx₁…₅, Δy₁…₅, τ)`` — speed (m/s), slip angle
(deg), yaw rate (deg/s), lateral error (m) and heading error (deg) relative to the centre line, the 5 next waypoints
in the car's frame (m), and the remaining horizon (s).

The road is a **fixed course**, the same for every environment: a closed circuit of four identical quarters, each a
30 m straight, a 120° left curve of radius 25 m, a 10 m straight and a 30° right curve of radius 30 m (432 m in
all). Variety comes from the start: each episode starts at a uniformly drawn point of the circuit with random
speed, slip, yaw rate, lateral and heading errors and horizon τ ~ U(0, ``tau_max``).

A step applies one of the 25 actions (throttle ``i // 5`` ∈ {0.6 … 1.0}, steer ``i % 5`` ∈ {−0.8 … 0.8}) for
``dt`` = 0.05 s, integrated by ``substeps`` explicit Euler steps: at low speed the tyres' slip dynamics have time
constants near 0.03 s, and one Euler step of 0.05 s would oscillate and diverge there. Process noise (Brownian,
``noise_std`` per √s on ``(vx, β, ω, e, ψ)``) stands for what the model leaves out, and makes the safety probability
of a state a probability rather than 0 or 1. The episode ends with reward 1 when τ reaches 0, and with 0 when
|e| > ``lateral_bound`` or vx < ``min_speed``.
"""

from __future__ import annotations

import math

import torch

from envs.safety.base import SafetyEnv
from envs.safety.physics import (
    BETA,
    DEG,
    HEADING,
    LATERAL,
    TAU,
    VEHICLE_STATE_DIM,
    VX,
    VehicleParameters,
    VehiclePhysics,
    vehicle_controls,
    vehicle_dynamics,
)

# One quarter of the circuit: (length m, turn rad). Four quarters turn 4 × 90° and close the loop.
_QUARTER = ((30.0, 0.0), (25.0 * 2 * math.pi / 3, 2 * math.pi / 3), (10.0, 0.0), (30.0 * math.pi / 6, -math.pi / 6))
_TRACK_RESOLUTION = 0.25  # m between the stored centre-line points
_WAYPOINTS = 5


def _circuit(resolution: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Centre line sampled every ``resolution`` m: positions ``[S + 1, 2]``, unwrapped headings and curvatures
    ``[S + 1]``; the last point closes the loop (the first point, one lap on)."""
    # Each piece turns exactly its angle over a whole number of samples, so the loop closes.
    pieces = [(round(length / resolution), turn) for length, turn in _QUARTER * 4]
    curvature = torch.cat([torch.full((n,), turn / (n * resolution), dtype=torch.float64) for n, turn in pieces])
    heading = torch.cat((torch.zeros(1, dtype=torch.float64), torch.cumsum(curvature * resolution, 0)))
    middle = 0.5 * (heading[1:] + heading[:-1])  # midpoint rule: exact headings, O(ds²) positions
    steps = torch.stack((torch.cos(middle), torch.sin(middle)), 1) * resolution
    xy = torch.cat((torch.zeros(1, 2, dtype=torch.float64), torch.cumsum(steps, 0)))
    curvature = torch.cat((curvature, curvature[:1]))
    return xy.float(), heading.float(), curvature.float()


class VehicleEnv(SafetyEnv):
    """Batched vehicle on the fixed circuit. All state lives in buffers, so ``state_dict`` captures it exactly.

    Args:
        num_envs: cars stepped together.
        tau_max: horizons are drawn from U(0, tau_max) s.
        lateral_bound: |e| above it ends the episode (m).
        min_speed: vx below it ends the episode (m/s).
        start_spread: start states are drawn uniformly from the PDE's collocation box (vx 5–20 m/s, β ±10°,
            ω ±30°/s, e ±0.95 × lateral_bound, ψ ±30°: :class:`~envs.safety.physics.VehiclePhysics`) shrunk
            around its centre by this factor; 1 is the whole box, where the learned V is checked against Monte Carlo.
        noise_std: process noise on (vx, β, ω, e, ψ), per √s, in state units.
        dt: seconds per step.
        substeps: Euler steps per ``dt``.
        waypoint_spacing: metres between the 5 waypoints ahead (the first one ``waypoint_spacing`` ahead).
        seed: base seed; car ``i`` draws from stream ``seed + i``.
        device: where the batch lives.
        compile_step: the step and reset each compiled into one graph (:class:`~envs.base.BatchedEnv`).
    """

    extra_state = ("arc",)
    initial_draws = 7
    noise_dims = 5

    def __init__(
        self,
        num_envs: int = 1,
        tau_max: float = 5.0,
        lateral_bound: float = 1.0,
        min_speed: float = 4.0,
        start_spread: float = 1.0,
        noise_std: tuple[float, float, float, float, float] = (2.5, 10.0, 50.0, 0.25, 10.0),
        dt: float = 0.05,
        substeps: int = 4,
        waypoint_spacing: float = 2.0,
        seed: int = 0,
        device: str | torch.device = "cpu",
        compile_step: bool = False,
    ) -> None:
        if lateral_bound <= 0:
            raise ValueError(f"lateral_bound must be > 0, got {lateral_bound}")
        if min_speed < 0:
            raise ValueError(f"min_speed must be >= 0, got {min_speed}")
        if not 0 < start_spread <= 1:
            raise ValueError(f"start_spread must be in (0, 1], got {start_spread}")
        if len(noise_std) != 5 or min(noise_std) < 0:
            raise ValueError(f"noise_std must be 5 values >= 0 for (vx, beta, omega, e, psi), got {noise_std}")
        if substeps < 1:
            raise ValueError(f"substeps must be >= 1, got {substeps}")
        if waypoint_spacing <= 0:
            raise ValueError(f"waypoint_spacing must be > 0, got {waypoint_spacing}")
        super().__init__(num_envs, VEHICLE_STATE_DIM, 25, dt, tau_max, seed, device, compile_step)
        self.lateral_bound, self.min_speed = lateral_bound, min_speed
        self.start_spread, self.noise_std = start_spread, tuple(noise_std)
        self.substeps, self.waypoint_spacing = substeps, waypoint_spacing
        self.params = VehicleParameters()
        #: the dynamics and collocation domain the PIRL loss uses: the same model as this environment.
        self.physics = VehiclePhysics(self.params, lateral_bound=lateral_bound, tau_max=tau_max)
        # Start states: the collocation box, shrunk by start_spread around its centre.
        low_speed, high_speed = self.physics.speed_range
        centre = [(low_speed + high_speed) / 2, 0.0, 0.0, 0.0, 0.0]
        half_width = [
            (high_speed - low_speed) / 2,
            self.physics.slip_range,
            self.physics.yaw_rate_range,
            self.physics.interior_margin * lateral_bound,
            self.physics.heading_range,
        ]
        self.register_buffer("start_centre", torch.tensor(centre, device=self.device), persistent=False)
        self.register_buffer(
            "start_half_width", start_spread * torch.tensor(half_width, device=self.device), persistent=False
        )
        xy, heading, curvature = _circuit(_TRACK_RESOLUTION)
        self.track_length = (xy.shape[0] - 1) * _TRACK_RESOLUTION
        self.register_buffer("track_xy", xy.to(self.device), persistent=False)
        self.register_buffer("track_heading", heading.to(self.device), persistent=False)
        self.register_buffer("track_curvature", curvature.to(self.device), persistent=False)
        self.register_buffer("arc", torch.zeros(num_envs, device=self.device))  # position along the circuit (m)
        ahead = torch.arange(1, _WAYPOINTS + 1, dtype=torch.float32) * waypoint_spacing
        self.register_buffer("waypoint_ahead", ahead.to(self.device), persistent=False)
        self.register_buffer("noise_scale", torch.tensor(noise_std, device=self.device) * dt**0.5, persistent=False)

    # ------------------------------------------------------------------------------------------------- road
    def _road(self, arc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Centre-line position ``[..., 2]`` and heading (rad) at arc lengths ``arc`` (any shape), interpolated."""
        position = torch.remainder(arc, self.track_length) / _TRACK_RESOLUTION
        index = position.long().clamp_max(self.track_heading.shape[0] - 2)
        frac = position - index
        # torch.take on flat indices: several times faster than advanced indexing on the CPU.
        flat = index * 2
        x = torch.lerp(self.track_xy.take(flat), self.track_xy.take(flat + 2), frac)
        y = torch.lerp(self.track_xy.take(flat + 1), self.track_xy.take(flat + 3), frac)
        heading = torch.lerp(self.track_heading.take(index), self.track_heading.take(index + 1), frac)
        return torch.stack((x, y), -1), heading

    def _curvature(self, arc: torch.Tensor) -> torch.Tensor:
        index = (torch.remainder(arc, self.track_length) / _TRACK_RESOLUTION).long()
        return self.track_curvature.take(index)

    def _waypoints(self, arc: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The 5 waypoints ahead in the car's frame: ``[N, 10]`` = Δx₁…₅, Δy₁…₅."""
        road_xy, road_heading = self._road(arc)
        normal = torch.stack((-torch.sin(road_heading), torch.cos(road_heading)), -1)
        car_xy = road_xy + state[:, LATERAL, None] * normal
        car_heading = road_heading + state[:, HEADING] / DEG
        points, _ = self._road(arc.unsqueeze(1) + self.waypoint_ahead)
        delta = points - car_xy.unsqueeze(1)
        cos, sin = torch.cos(car_heading).unsqueeze(1), torch.sin(car_heading).unsqueeze(1)
        along = cos * delta[..., 0] + sin * delta[..., 1]
        across = -sin * delta[..., 0] + cos * delta[..., 1]
        return torch.cat((along, across), dim=1)

    # ---------------------------------------------------------------------------------------------- dynamics
    def _initial_state(self, uniforms: torch.Tensor) -> dict[str, torch.Tensor]:
        state = torch.zeros(uniforms.shape[0], VEHICLE_STATE_DIM, device=self.device)
        state[:, :5] = self.start_centre + self.start_half_width * (2 * uniforms[:, :5] - 1)
        state[:, TAU] = self.tau_max * uniforms[:, 5]
        arc = self.track_length * uniforms[:, 6]
        state[:, 5:TAU] = self._waypoints(arc, state)
        return {"state": state, "arc": arc}

    def _advance(self, action: torch.Tensor, noise: torch.Tensor) -> None:
        throttle, steer = vehicle_controls(action)
        # Contiguous columns: elementwise ops on strided views of the [N, 16] state take a slow path.
        vehicle = list(self.state[:, :5].T.contiguous())
        arc = self.arc
        h = self.dt / self.substeps
        for _ in range(self.substeps):
            *rates, arc_rate = vehicle_dynamics(*vehicle, throttle, steer, self._curvature(arc), self.params)
            vehicle = [value + h * rate for value, rate in zip(vehicle, rates, strict=True)]
            arc = arc + h * arc_rate
        vehicle = torch.stack(vehicle, 1) + self.noise_scale * noise
        # Keep the slip angle inside the model's domain (tan β); a car sliding that far leaves the lane anyway.
        vehicle[:, BETA].clamp_(-80.0, 80.0)
        self.arc.copy_(torch.remainder(arc, self.track_length))
        self.state[:, :5] = vehicle
        self.state[:, 5:TAU] = self._waypoints(self.arc, self.state)

    def _unsafe(self) -> torch.Tensor:
        return (self.state[:, LATERAL].abs() > self.lateral_bound) | (self.state[:, VX] < self.min_speed)
