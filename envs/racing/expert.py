"""The racing expert (docs/reference_systems.md §4): a time-optimal speed profile along the centre line and a
steering law that tracks it.

**Speed profile.** The fastest speed at each point of the track that the grip allows, v ≤ √(margin · grip / |κ|),
capped at the top speed, then lowered wherever the car could not brake down to the next point's limit in time (a
backward pass at ``braking`` m/s²) or could not have accelerated up to it (a forward pass at the car's 4 m/s²) — the
classic forward-backward solution for a point mass with a friction limit, computed once per track. Driving it is
what a fixed profile costs: the line is the centre line, with no use of the track's width, which is the lap time a
learned policy can still win.

**Control** (batched over cars, tensor ops only): the acceleration tracks the profile's speed a short preview ahead,
``a = gain · (v_target − v)`` clipped to the action box; the steering is Stanley's law around the curvature's
feed-forward, ``δ = atan(L κ) − k_ψ · heading error − atan(k_e · e / (v + 1))``, clipped to ±25°.

It reads the observation (either kind: it knows its environment's layout) and the privileged ``arc`` entry — and
``circuit``, which circuit each car drives, when the environment has several (one profile per circuit) — and writes
``action``: a TorchRL policy module, so the demonstration collector runs it like any learned policy. Its actions
depend on the car's state only, not on the kind of observation that carries it.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from envs.racing.env import ACCELERATION_RANGE, STEERING_LIMIT, RacingEnv


def speed_profile(
    curvature: list[float], spacing: float, grip: float, max_speed: float, accelerating: float, braking: float
) -> list[float]:
    """Forward-backward speed profile on a closed loop of points ``spacing`` m apart (the last point is the first)."""
    count = len(curvature) - 1
    limit = [min(max_speed, math.sqrt(grip / max(abs(kappa), 1e-9))) for kappa in curvature[:count]]
    speed = list(limit)
    for rate, order in ((braking, range(2 * count - 1, -1, -1)), (accelerating, range(2 * count))):
        step = -1 if order.step < 0 else 1
        # Twice around the loop: the constraint coming back across the start line is then in place too.
        for i in order:
            here, previous = i % count, (i - step) % count
            speed[here] = min(speed[here], math.sqrt(speed[previous] ** 2 + 2 * rate * spacing))
    return [*speed, speed[0]]


class TimeOptimalExpert(TensorDictModuleBase):
    """The expert driver of a :class:`~envs.racing.env.RacingEnv`'s track and car.

    Args:
        env: the environment whose track and car it drives (any batch size; only its parameters are read).
        margin: the fraction of the grip the profile plans to use.
        braking: deceleration the profile plans with (m/s², below the car's 6).
        preview: seconds of look-ahead for the speed target and the curvature feed-forward.
        speed_gain: acceleration per m/s of speed error (1/s).
        heading_gain, lateral_gain: Stanley's gains on the heading error and the lateral error.
    """

    def __init__(
        self,
        env: RacingEnv,
        margin: float = 0.9,
        braking: float = 5.0,
        preview: float = 0.3,
        speed_gain: float = 4.0,
        heading_gain: float = 1.0,
        lateral_gain: float = 1.0,
    ) -> None:
        super().__init__()
        #: what the expert's actions depend on besides the environment (demonstration files are keyed by it).
        self.options = {
            "margin": margin,
            "braking": braking,
            "preview": preview,
            "speed_gain": speed_gain,
            "heading_gain": heading_gain,
            "lateral_gain": lateral_gain,
        }
        self.several = env.source is not None
        self.in_keys, self.out_keys = ["observation", "arc", *(["circuit"] if self.several else [])], ["action"]
        self.circuits, self.wheelbase = env.circuits, env.lf + env.lr
        self.road, self.half_width, self.max_speed = env.observation_kind == "road", env.width / 2, env.max_speed
        self.preview, self.speed_gain = preview, speed_gain
        self.heading_gain, self.lateral_gain = heading_gain, lateral_gain
        profiles = [
            speed_profile(
                track.curvature.tolist(),
                track.resolution,
                margin * env.grip,
                env.max_speed,
                ACCELERATION_RANGE[1],
                braking,
            )
            for track in self.circuits.tracks
        ]
        samples = self.circuits.xy.shape[1]  # padded like the circuits' samples; the padding is never read
        padded = [profile + [profile[-1]] * (samples - len(profile)) for profile in profiles]
        self.register_buffer("profile", torch.tensor(padded, device=self.circuits.xy.device))

    def _circuit(self, tensordict: TensorDictBase, arc: torch.Tensor) -> torch.Tensor:
        if self.several:
            return tensordict["circuit"].squeeze(-1)
        return torch.zeros(arc.shape, dtype=torch.long, device=arc.device)

    def target_speed(self, arc: torch.Tensor, circuit: torch.Tensor | None = None) -> torch.Tensor:
        """The profile's speed at arc lengths ``arc`` of circuits ``circuit`` (default: the first)."""
        if circuit is None:
            circuit = torch.zeros(arc.shape, dtype=torch.long, device=arc.device)
        return self.circuits.interpolate(self.profile, circuit, arc)

    def car_state(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Lateral error (m), heading error (rad), vx and vy (m/s) read from either kind of observation."""
        if self.road:
            offset, sin, cos, vx, vy = observation.unbind(-1)[:5]
            return offset * self.half_width, torch.atan2(sin, cos), vx * self.max_speed, vy * self.max_speed
        return tuple(observation.unbind(-1)[:4])

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        observation, arc = tensordict["observation"], tensordict["arc"].squeeze(-1)
        circuit = self._circuit(tensordict, arc)
        lateral, heading_error, vx, vy = self.car_state(observation)
        speed = torch.sqrt(vx.square() + vy.square())
        ahead = arc + self.preview * speed
        acceleration = (self.speed_gain * (self.target_speed(ahead, circuit) - speed)).clamp(*ACCELERATION_RANGE)
        _, _, curvature = self.circuits.at(circuit, ahead)
        steering = (
            torch.atan(self.wheelbase * curvature)
            - self.heading_gain * heading_error
            - torch.atan(self.lateral_gain * lateral / (speed + 1.0))
        ).clamp(-STEERING_LIMIT, STEERING_LIMIT)
        tensordict.set("action", torch.stack((acceleration, steering), -1))
        return tensordict


class FlooredThrottle(TimeOptimalExpert):
    """The expert's steering with the throttle floored: a driver who never brakes. On a car with a speed limiter
    (``RacingEnv(speed_limiter=...)``) the limiter does all its braking, so its lap is the fastest the limiter allows
    on the expert's line (``benchmarks/racing_generalisation.py --ceiling``); without one it arrives at corners as an
    actor that has only seen short straights may drive a long one."""

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict = super().forward(tensordict)
        action = tensordict["action"].clone()
        action[..., 0] = ACCELERATION_RANGE[1]
        return tensordict.set("action", action)
