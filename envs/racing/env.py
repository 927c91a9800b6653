"""Racing (docs/reference_systems.md §4): cars on a closed track as one batched TorchRL environment, stepped by tensor
ops (CPU or CUDA).

**Car.** A kinematic bicycle at the centre of mass (wheelbase ``lf + lr``) with a grip limit: steering δ gives the
slip angle β = atan(lr / (lf + lr) · tan δ) and the yaw rate ω = v cos β tan δ / (lf + lr); when the lateral
acceleration v·ω would exceed ``grip`` (m/s²), ω and β are scaled down to it, so a car that enters a curve too fast
runs wide instead of following the line. That limit is what makes a speed profile matter. Speed v changes by the
acceleration action and stays in [0, ``max_speed``]; one explicit Euler step per ``dt`` = 0.02 s.

**Interface (the reference's).** Actions ``[acceleration m/s², steering rad]`` in the box [−6, 4] × [−25°, 25°]; an
action outside the box is clipped to it (TorchRL's spec check is off on this hot path). Observation (8): lateral error e
(m, positive left of the centre line), heading error (rad, car heading − track heading, in [−π, π)), vx, vy (m/s, the
car's frame), the track tangent (cos, sin) at the car, cos ψ, sin ψ. With ``curvature_ahead`` (metres, e.g.
``[5, 15, 30]``) the track's curvature at those distances ahead of the car, times ``CURVATURE_SCALE``, follows them:
the reference's 8 numbers show no curve before the car is in it, and a policy cloned from them does not learn to brake
for one (docs/history/racing.md, "2026-11-24: behaviour cloning, why the two departures from the reference's setup").
The entry ``arc`` (m along the centre line) is privileged information for the expert and the metrics; policies read
``observation`` only.

**Road observation** (``observation="road"``). The reference's observation carries the track's tangent and the car's
heading in world coordinates, so a policy can learn where it is on one circuit instead of how to drive, and it fails
on any other (issue 31). The road observation describes only the car relative to the road: ``ROAD_FEATURES`` = lateral
offset / half width, sin and cos of the heading error, vx and vy / ``max_speed``, the yaw rate (rad/s), the distances
to the left and right edges / half width, the speed along the centre line / ``max_speed``; then the curvature at the
``curvature_ahead`` distances (``ROAD_AHEAD`` when none are given) times ``CURVATURE_SCALE``. Rotating or moving the
whole circuit and car leaves it unchanged (``tests/envs/test_circuits.py``).

**Circuits.** ``tracks`` (:mod:`envs.racing.circuits`) replaces the one circuit of ``control_points`` by a
set of generated ones — a training pool or the held-out circuits, drawn per episode or fixed per car. Each car then
drives its own circuit (``circuit`` buffer, indices into :class:`~envs.racing.track.Circuits`), and the
entry ``circuit`` (privileged, like ``arc``) says which. A per-episode draw is one more uniform from the car's stream
at its reset, so the circuits driven are part of the seeded, checkpointed state.

**Reward** per step, each weight a constructor argument:
``speed · v cos(heading error) / max_speed − tracking · (e / half width)² − heading · (1 − cos heading error)
− smoothness · |Δaction / action range|² − off_track · [|e| > half width]``, and ``− crash`` when the car ends the
episode by leaving the track's run-off (|e| > half width + ``runoff``). Episodes are truncated at ``max_steps``
(5,000 steps, 100 s), so a faster car earns more speed reward per episode.

**Episode metrics** (summed over the episode by evaluation, like Snake's food): ``progress`` — laps driven along the
centre line (fractional); ``laps`` — laps completed; ``lap_time`` — the time of the first completed lap (s; 0 if
none). A lap is a full track length of progress from where the episode started.

**Speed limiter** (``speed_limiter``, off by default). A driver aid of the car, the same for every driver (the expert,
a clone, SAC): the fastest speed from which the car can still brake, at ``braking`` m/s², to the grip's corner speed
(``margin`` of the grip) at every point of the centre line up to ``horizon`` m ahead (read every ``spacing`` m), and
to a corner of ``unseen_radius`` m just beyond it; an acceleration that would pass that speed is lowered to meet
it (down to the car's full braking). A policy keeps every choice of line, steering and throttle under the limit; what
it cannot do is arrive at a corner faster than the road ahead allows, on any circuit, however long the straight
before it (issue 48). The reward's smoothness term reads the policy's action, not the limited one.

**Starts.** Each episode starts at a uniformly drawn point of the track, within ``start_lateral`` m of the centre
line, heading within ``start_heading`` rad of the track's, at a speed in [0, ``start_speed``] m/s. Randomness is
counter-based (:mod:`envs.counter_rng`): car ``i`` of a batch seeded ``seed`` drives the episodes of a
single car seeded ``seed + i``. All state is in buffers, so ``state_dict`` captures it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Composite, Unbounded

from envs.base import BatchedEnv, MaskedResets
from envs.counter_rng import random_bits, uniform
from envs.drawing import fill_polygon
from envs.racing.circuits import TrackSource
from envs.racing.track import DEFAULT_CIRCUIT, Circuits, Track, wrap_angle

ACCELERATION_RANGE = (-6.0, 4.0)  # m/s²
STEERING_LIMIT = math.radians(25.0)  # rad
OBSERVATION_DIM = 8  # the reference's observation, before any curvature ahead
OBSERVATIONS = ("reference", "road")
ROAD_FEATURES = 9  # the road observation, before the curvature ahead
#: the road observation's default look-ahead (m): from the car to about the braking distance from top speed.
ROAD_AHEAD = (0.0, 5.0, 10.0, 20.0, 35.0, 50.0, 70.0)
CURVATURE_SCALE = 20.0  # 1/m → about unit scale: the default track's curvature reaches 0.053 /m
_START_DRAWS = 4  # uniforms per reset: arc, lateral offset, heading offset, speed (then the circuit, if drawn)
#: ``render``: the longer side of the image (pixels), and the grass around the track's bounding box (m).
RENDER_SIZE, RENDER_MARGIN = 512, 5.0
#: ``render``'s colours: grass, run-off, asphalt, centre line, the car's rear and its front (the heading).
GRASS, RUNOFF, ASPHALT, CENTRE_LINE = (40, 110, 50), (150, 140, 110), (70, 70, 78), (210, 210, 210)
CAR_REAR, CAR_FRONT = (220, 40, 40), (250, 220, 40)
#: the car as drawn (m): its length over the axles and overhangs, and its width.
CAR_LENGTH, CAR_WIDTH = 4.5, 2.0


@dataclass(frozen=True)
class SpeedLimiter:
    """The car's speed limiter (module docstring): what it reads of the road and how it plans to brake."""

    margin: float = 1.0  # the share of the grip a corner's speed may use
    braking: float = 5.0  # m/s² it plans to brake with: below the car's 6, which keeps the last metre in hand
    horizon: float = 70.0  # m of road ahead it reads: the road observation's farthest look-ahead
    spacing: float = 2.0  # m between the points it reads: finer than any corner's length
    unseen_radius: float = 8.0  # m: the corner it assumes just beyond the horizon (the default generator's are >= 12)

    @staticmethod
    def parse(options: Mapping[str, Any]) -> SpeedLimiter:
        if not isinstance(options, Mapping):
            raise ValueError(f"speed_limiter must be a mapping of options (margin, braking, …), got {options!r}")
        known = sorted(SpeedLimiter.__dataclass_fields__)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"speed_limiter.{unknown[0]}: unknown option; the options are {', '.join(known)}")
        limiter = SpeedLimiter(**{name: float(value) for name, value in options.items()})
        for name, value in asdict(limiter).items():
            if not value > 0:
                raise ValueError(f"speed_limiter.{name} must be > 0, got {value}")
        if limiter.margin > 1:
            raise ValueError(f"speed_limiter.margin must be <= 1 (a share of the grip), got {limiter.margin}")
        if limiter.braking > -ACCELERATION_RANGE[0]:
            raise ValueError(
                f"speed_limiter.braking must be <= the car's {-ACCELERATION_RANGE[0]:g} m/s², got {limiter.braking}"
            )
        return limiter


class RacingEnv(MaskedResets, BatchedEnv):
    """Batched race cars on a closed track.

    Args:
        num_envs: cars stepped together.
        control_points: the track's centre line (:class:`~envs.racing.track.Track`); default: the 450 m
            circuit.
        width: track width (m).
        max_steps: episode length limit (steps of ``dt``).
        dt: seconds per step.
        lf, lr: distances from the centre of mass to the front and rear axles (m).
        grip: the largest lateral acceleration the tyres hold (m/s²).
        grip_range: ``[low, high]`` (m/s²): each episode's car holds a grip drawn uniformly from it instead of
            ``grip``, unobserved. A policy trained so cannot rely on the last tenth of the grip the way a policy tuned
            to one car does; it learns to keep a margin, which a corner sharper than any it trained on needs (issue 48).
        speed_limiter: the car's speed limiter (:class:`SpeedLimiter` options: ``margin``, ``braking``,
            ``horizon``, ``spacing``, ``unseen_radius``; ``{}`` for its defaults); None: none.
        max_speed: top speed (m/s).
        runoff: metres beyond the track's edge before the car crashes (the episode ends).
        start_lateral, start_heading, start_speed: ranges of the start state (m, rad, m/s).
        curvature_ahead: distances ahead (m) at which the track's curvature joins the observation; empty: the
            reference's 8 (the road observation's default: ``ROAD_AHEAD``).
        observation: ``reference`` (the reference's 8 numbers) or ``road`` (the car relative to the road only).
        tracks: a circuit source (:class:`~envs.racing.circuits.TrackSource` options: ``generator``,
            ``seed``, ``per``, ``split``, ``pool``, ``held_out``, ``directions``) instead of ``control_points``; None:
            the one circuit of ``control_points``.
        speed, tracking, heading, smoothness, off_track, crash: the reward's weights.
        seed: base seed; car ``i`` draws from stream ``seed + i``.
        device: where the batch lives.
        compile_step: the step and reset each compiled into one graph (:class:`~envs.base.BatchedEnv`).
    """

    episode_metric_keys = ("progress", "laps", "lap_time")
    episode_metric_over = {"lap_time": "laps"}  # a lap's time means something only where a lap was completed
    can_render = True

    def __init__(
        self,
        num_envs: int = 1,
        control_points: Sequence[Sequence[float]] = DEFAULT_CIRCUIT,
        width: float = 4.0,
        max_steps: int = 5_000,
        dt: float = 0.02,
        lf: float = 1.2,
        lr: float = 1.4,
        grip: float = 8.0,
        grip_range: Sequence[float] | None = None,
        speed_limiter: Mapping[str, float] | None = None,
        max_speed: float = 30.0,
        runoff: float = 1.0,
        start_lateral: float = 0.5,
        start_heading: float = 0.1,
        start_speed: float = 10.0,
        curvature_ahead: Sequence[float] = (),
        observation: str = "reference",
        tracks: Mapping[str, Any] | None = None,
        speed: float = 1.0,
        tracking: float = 0.5,
        heading: float = 0.5,
        smoothness: float = 0.1,
        off_track: float = 1.0,
        crash: float = 10.0,
        seed: int = 0,
        device: str | torch.device = "cpu",
        compile_step: bool = False,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        for name, value in (("max_steps", max_steps), ("dt", dt), ("lf", lf), ("lr", lr), ("grip", grip)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not max_speed > 0:
            raise ValueError(f"max_speed must be > 0, got {max_speed}")
        if grip_range is not None and not (len(grip_range) == 2 and 0 < grip_range[0] <= grip_range[1]):
            raise ValueError(f"grip_range must be [low, high] with 0 < low <= high (m/s²), got {list(grip_range)}")
        for name, value in (("runoff", runoff), ("start_lateral", start_lateral), ("start_speed", start_speed)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not width > 0:
            raise ValueError(f"width must be > 0, got {width}")
        if start_lateral >= width / 2:
            raise ValueError(f"start_lateral ({start_lateral}) must be < width / 2 ({width / 2}): starts on the track")
        if not 0 <= start_heading < math.pi / 2:
            raise ValueError(f"start_heading must be in [0, π/2), got {start_heading}")
        if start_speed > max_speed:
            raise ValueError(f"start_speed ({start_speed}) must be <= max_speed ({max_speed})")
        if any(not distance >= 0 for distance in curvature_ahead):
            raise ValueError(f"curvature_ahead must be distances >= 0 (m), got {list(curvature_ahead)}")
        if observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {', '.join(OBSERVATIONS)}, got {observation!r}")
        source = None if tracks is None else TrackSource.parse(tracks)
        limiter = None if speed_limiter is None else SpeedLimiter.parse(speed_limiter)
        super().__init__(batch_size=torch.Size([num_envs]), device=device, compile_step=compile_step)
        self.source = source
        if self.source is None:
            self._track = Track(control_points, width).to(self.device)  # raises on an impossible track
            self.circuits = Circuits([self._track])
        else:
            self._track = None
            self.circuits = Circuits(self.source.tracks(width, runoff)).to(self.device)
        self.observation_kind = observation
        if observation == "road" and not curvature_ahead:
            curvature_ahead = ROAD_AHEAD
        self.curvature_ahead = tuple(float(distance) for distance in curvature_ahead)
        self.register_buffer("ahead", torch.tensor(self.curvature_ahead, device=self.device), persistent=False)
        self.control_points = tuple(tuple(float(c) for c in point) for point in control_points)
        self.width, self.max_steps, self.dt = float(width), int(max_steps), float(dt)
        self.lf, self.lr, self.grip, self.max_speed, self.runoff = lf, lr, grip, max_speed, runoff
        self.grip_range = None if grip_range is None else (float(grip_range[0]), float(grip_range[1]))
        self.speed_limiter = limiter
        reads = torch.arange(0.0, limiter.horizon + 1e-6, limiter.spacing) if limiter else torch.zeros(0)
        self.register_buffer("limiter_ahead", reads.to(self.device), persistent=False)
        self.start_lateral, self.start_heading, self.start_speed = start_lateral, start_heading, start_speed
        self.weights = {
            "speed": speed,
            "tracking": tracking,
            "heading": heading,
            "smoothness": smoothness,
            "off_track": off_track,
            "crash": crash,
        }
        n, dev = num_envs, self.device
        for name in ("x", "y", "yaw", "speed", "arc", "start_arc", "progress", "elapsed"):
            self.register_buffer(name, torch.zeros(n, device=dev))
        self.register_buffer("last_action", torch.zeros(n, 2, device=dev))
        self.register_buffer("laps", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("steps", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("stream", torch.arange(n, dtype=torch.long, device=dev) + seed)
        self.register_buffer("draws", torch.zeros(n, dtype=torch.long, device=dev))
        # Each car's circuit: state to save only when there is a choice of circuits (a one-circuit env's checkpoints
        # keep their old keys).
        self.register_buffer(
            "circuit", torch.zeros(n, dtype=torch.long, device=dev), persistent=self.source is not None
        )
        self._assign_circuits_per_env()
        # Each car's grip this episode: state to save only when it is drawn (other checkpoints keep their old keys).
        self.register_buffer("car_grip", torch.full((n,), float(grip), device=dev), persistent=grip_range is not None)
        low = torch.tensor([ACCELERATION_RANGE[0], -STEERING_LIMIT], device=dev)
        high = torch.tensor([ACCELERATION_RANGE[1], STEERING_LIMIT], device=dev)
        self.register_buffer("action_low", low, persistent=False)
        self.register_buffer("action_high", high, persistent=False)
        batch = (n,)
        features = OBSERVATION_DIM if observation == "reference" else ROAD_FEATURES
        privileged = (
            {} if self.source is None else {"circuit": Unbounded(shape=(*batch, 1), dtype=torch.long, device=dev)}
        )
        self.observation_spec = Composite(
            observation=Unbounded(shape=(*batch, features + len(self.curvature_ahead)), device=dev),
            arc=Unbounded(shape=(*batch, 1), device=dev),
            **privileged,
            **{key: Unbounded(shape=(*batch, 1), device=dev) for key in self.episode_metric_keys},
            shape=batch,
            device=dev,
        )
        self.action_spec = Bounded(low=low.expand(n, 2), high=high.expand(n, 2), shape=(*batch, 2), device=dev)
        self.reward_spec = Unbounded(shape=(*batch, 1), device=dev)

    @property
    def track(self) -> Track:
        """The one circuit of a ``control_points`` env (a ``tracks`` env has several: :attr:`circuits`)."""
        if self._track is None:  # not AttributeError: nn.Module's __getattr__ would replace the message
            raise RuntimeError("this RacingEnv drives several circuits (tracks=...): read env.circuits")
        return self._track

    def _assign_circuits_per_env(self) -> None:
        # per: env — car i (stream seed + i) keeps circuit (seed + i) mod count: a held-out evaluation's cars spread
        # evenly over its circuits.
        if self.source is not None and self.source.per == "env":
            self.circuit.copy_(torch.remainder(self.stream, len(self.circuits)))

    def lateral_of(self, observation: torch.Tensor) -> torch.Tensor:
        """The lateral error (m, positive left) that ``observation [..., D]`` holds."""
        if self.observation_kind == "road":
            return observation[..., 0] * (self.width / 2)
        return observation[..., 0]

    # ---------------------------------------------------------------------------------------------- dynamics
    def slip_and_yaw_rate(self, speed: torch.Tensor, steering: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bicycle's slip angle β and yaw rate ω at ``speed`` and ``steering``, within the grip limit."""
        wheelbase = self.lf + self.lr
        tan = torch.tan(steering)
        beta = torch.atan(self.lr / wheelbase * tan)
        yaw_rate = speed * torch.cos(beta) * tan / wheelbase
        # Lateral acceleration v·ω above the grip: the tyres slide, the car turns only as much as grip allows.
        grip = self.grip if self.grip_range is None else self.car_grip
        scale = (grip / (speed * yaw_rate.abs()).clamp_min(1e-6)).clamp_max(1.0)
        return beta * scale, yaw_rate * scale

    # ----------------------------------------------------------------------------------------------- render
    def render(self, index: int = 0) -> np.ndarray:
        """Car ``index`` on the whole track, seen from above (north up): the track drawn once per environment, the
        car a rectangle of ``CAR_LENGTH`` × ``CAR_WIDTH`` m at its position and heading, its front half in
        ``CAR_FRONT``. :meth:`pixel_of` maps track coordinates to the image's."""
        index = self._render_index(index)
        circuit = int(self.circuit[index])
        image = self._track_image(circuit).copy()
        x, y, yaw = (float(getattr(self, name)[index]) for name in ("x", "y", "yaw"))
        forward = np.array([math.cos(yaw), math.sin(yaw)])
        left = np.array([-forward[1], forward[0]])
        half_length, half_width = CAR_LENGTH / 2, CAR_WIDTH / 2
        for colour, (back, front) in ((CAR_REAR, (-half_length, 0.0)), (CAR_FRONT, (0.0, half_length))):
            corners = [
                np.array([x, y]) + along * forward + side * left
                for along, side in ((back, -half_width), (front, -half_width), (front, half_width), (back, half_width))
            ]
            fill_polygon(image, np.array([self._pixel(circuit, *corner) for corner in corners]), colour)
        return image

    def pixel_of(self, x: float, y: float, index: int = 0) -> tuple[float, float]:
        """Where the track point ``(x, y)`` (m) is in :meth:`render`'s image of car ``index``: ``(column, row)`` in
        pixels."""
        circuit = int(self.circuit[self._render_index(index)])
        self._track_image(circuit)
        return self._pixel(circuit, x, y)

    def _pixel(self, circuit: int, x: float, y: float) -> tuple[float, float]:
        # pixel_of once the image's origin and scale are set (while the track is being drawn).
        (left, top), scale = self._render_frames[circuit]
        return (x - left) * scale, (top - y) * scale

    def _track_image(self, circuit: int) -> np.ndarray:
        """Circuit ``circuit`` without the car, drawn at its first call: bands along the centre line, widest first
        (run-off, asphalt, the centre line), each a chain of quadrilaterals between samples about a metre apart."""
        images = self.__dict__.setdefault("_track_pixels", {})
        if circuit in images:
            return images[circuit]
        track = self.circuits.tracks[circuit]
        step = max(1, round(1.0 / track.resolution))
        centre = track.xy[::step].double().cpu().numpy()
        heading = track.heading[::step].double().cpu().numpy()
        normal = np.stack((-np.sin(heading), np.cos(heading)), 1)
        low, high = centre.min(0) - RENDER_MARGIN, centre.max(0) + RENDER_MARGIN
        scale = RENDER_SIZE / float((high - low).max())
        width, height = (_macro_blocks(float(extent) * scale) for extent in high - low)
        if len(self.circuits) > 1:
            # Several circuits: every one centred on the same square, so a video's frames keep one size when the
            # car's circuit changes between episodes.
            width = height = _macro_blocks(RENDER_SIZE)
            centre_box = (low + high) / 2
            low, high = centre_box - width / scale / 2, centre_box + height / scale / 2
        self.__dict__.setdefault("_render_frames", {})[circuit] = ((float(low[0]), float(high[1])), scale)
        image = np.empty((height, width, 3), dtype=np.uint8)
        image[:] = GRASS
        line = 1.0 / scale  # the centre line: two pixels wide
        for half_width, colour in (
            (self.width / 2 + self.runoff, RUNOFF),
            (self.width / 2, ASPHALT),
            (line, CENTRE_LINE),
        ):
            left, right = centre + half_width * normal, centre - half_width * normal
            for i in range(len(centre) - 1):  # the samples close the loop: the last is the first again
                corners = np.array([left[i], left[i + 1], right[i + 1], right[i]])
                fill_polygon(image, np.array([self._pixel(circuit, x, y) for x, y in corners]), colour)
        images[circuit] = image
        return image

    def _observe(self, lateral: torch.Tensor, track_heading: torch.Tensor) -> TensorDict:
        heading_error = wrap_angle(self.yaw - track_heading)
        beta, yaw_rate = self.slip_and_yaw_rate(self.speed, self.last_action[:, 1])
        if self.observation_kind == "reference":
            observation = torch.stack(
                (
                    lateral,
                    heading_error,
                    self.speed * torch.cos(beta),
                    self.speed * torch.sin(beta),
                    torch.cos(track_heading),
                    torch.sin(track_heading),
                    torch.cos(self.yaw),
                    torch.sin(self.yaw),
                ),
                1,
            )
        else:
            observation = self._road(lateral, heading_error, beta, yaw_rate)
        if self.curvature_ahead:
            _, _, curvature = self.circuits.at(self.circuit, self.arc.unsqueeze(1) + self.ahead)
            observation = torch.cat((observation, CURVATURE_SCALE * curvature), 1)
        out = {"observation": observation, "arc": self.arc.unsqueeze(1).clone()}
        if self.source is not None:
            out["circuit"] = self.circuit.unsqueeze(1).clone()
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    def _road(
        self, lateral: torch.Tensor, heading_error: torch.Tensor, beta: torch.Tensor, yaw_rate: torch.Tensor
    ) -> torch.Tensor:
        """The road observation's first ``ROAD_FEATURES`` (module docstring): relative quantities only."""
        offset = lateral / (self.width / 2)
        _, _, curvature = self.circuits.at(self.circuit, self.arc)
        # Speed along the centre line: the velocity's component along the tangent, over the distance to the centre
        # of the curve (a car inside a curve covers more of the centre line than it drives). The run-off keeps
        # |κ e| well below 1 on a valid track; the floor only guards the division.
        along = self.speed * torch.cos(heading_error + beta) / (1 - curvature * lateral).clamp_min(0.1)
        return torch.stack(
            (
                offset,
                torch.sin(heading_error),
                torch.cos(heading_error),
                self.speed * torch.cos(beta) / self.max_speed,
                self.speed * torch.sin(beta) / self.max_speed,
                yaw_rate,
                1 - offset,
                1 + offset,
                along / self.max_speed,
            ),
            1,
        )

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        mask = torch.ones(self.batch_size, dtype=torch.bool, device=self.device) if mask is None else mask.view(-1)
        drawn = self.source is not None and self.source.per == "episode"
        draws = uniform(random_bits(self.stream, self.draws, _START_DRAWS + drawn))
        if drawn:  # the circuit first: the start is a point of it
            count = len(self.circuits)
            circuit = (draws[:, _START_DRAWS] * count).long().clamp_max(count - 1)
            self.circuit.copy_(torch.where(mask, circuit, self.circuit))
        if self.grip_range is not None:  # a slot of its own after the others: their draws stay as they were
            low, high = self.grip_range
            grip = low + (high - low) * uniform(random_bits(self.stream, self.draws, 1, _START_DRAWS + 1))[:, 0]
            self.car_grip.copy_(torch.where(mask, grip, self.car_grip))
        arc = self.circuits.length[self.circuit] * draws[:, 0]
        offset = self.start_lateral * (2 * draws[:, 1] - 1)
        centre, track_heading, _ = self.circuits.at(self.circuit, arc)
        normal = torch.stack((-torch.sin(track_heading), torch.cos(track_heading)), 1)
        position = centre + offset.unsqueeze(1) * normal
        fresh = {
            "x": position[:, 0],
            "y": position[:, 1],
            "yaw": track_heading + self.start_heading * (2 * draws[:, 2] - 1),
            "speed": self.start_speed * draws[:, 3],
            "arc": arc,
            "start_arc": arc,
            "progress": torch.zeros_like(arc),
            "elapsed": torch.zeros_like(arc),
        }
        # Every row, kept where the mask holds: fixed shapes, no host sync on a GPU.
        for name, value in fresh.items():
            buffer = getattr(self, name)
            buffer.copy_(torch.where(mask, value, buffer))
        keep = mask.unsqueeze(1)
        self.last_action.copy_(torch.where(keep, torch.zeros_like(self.last_action), self.last_action))
        self.laps.masked_fill_(mask, 0)
        self.steps.masked_fill_(mask, 0)
        self.draws.add_(mask)
        false = torch.zeros(*self.batch_size, 1, dtype=torch.bool, device=self.device)
        _, track_heading, _ = self.circuits.at(self.circuit, self.arc)
        _, lateral = self.circuits.project(self.circuit, torch.stack((self.x, self.y), 1), self.arc, window=0.0)
        out = self._observe(lateral, track_heading)
        zero = torch.zeros(*self.batch_size, 1, device=self.device)
        out.update({key: zero.clone() for key in self.episode_metric_keys})
        out.update({"done": false, "terminated": false.clone(), "truncated": false.clone()})
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = torch.maximum(torch.minimum(tensordict["action"], self.action_high), self.action_low)
        acceleration, steering = action.unbind(1)
        if self.speed_limiter is not None:
            limited = (self.speed_limit() - self.speed) / self.dt
            acceleration = torch.minimum(acceleration, limited).clamp_min(ACCELERATION_RANGE[0])
        beta, yaw_rate = self.slip_and_yaw_rate(self.speed, steering)
        direction = self.yaw + beta
        self.x.add_(self.dt * self.speed * torch.cos(direction))
        self.y.add_(self.dt * self.speed * torch.sin(direction))
        self.yaw.add_(self.dt * yaw_rate)
        self.speed.copy_((self.speed + self.dt * acceleration).clamp(0.0, self.max_speed))
        # The nearest centre-line point, searched around the last one: a car moves < 1 m per step.
        previous_arc = self.arc.clone()
        arc, lateral = self.circuits.project(self.circuit, torch.stack((self.x, self.y), 1), self.arc, window=2.0)
        self.arc.copy_(arc)
        length = self.circuits.length[self.circuit]
        advance = torch.remainder(arc - previous_arc + length / 2, length) - length / 2  # across the start line too
        self.progress.add_(advance)
        self.elapsed.add_(self.dt)
        self.steps.add_(1)
        completed = self.progress >= (self.laps + 1) * length
        first_lap_time = torch.where(completed & (self.laps == 0), self.elapsed, torch.zeros_like(self.elapsed))
        self.laps.add_(completed)

        _, track_heading, _ = self.circuits.at(self.circuit, arc)
        heading_error = wrap_angle(self.yaw - track_heading)
        half_width = self.width / 2
        change = (action - self.last_action) / (self.action_high - self.action_low)
        self.last_action.copy_(action)
        crashed = lateral.abs() > half_width + self.runoff
        w = self.weights
        reward = (
            w["speed"] * self.speed * torch.cos(heading_error) / self.max_speed
            - w["tracking"] * (lateral / half_width).square()
            - w["heading"] * (1 - torch.cos(heading_error))
            - w["smoothness"] * change.square().sum(1)
            - w["off_track"] * (lateral.abs() > half_width).float()
            - w["crash"] * crashed.float()
        )
        truncated = (self.steps >= self.max_steps) & ~crashed
        out = self._observe(lateral, track_heading)
        out.update(
            {
                "reward": reward.unsqueeze(1),
                "progress": (advance / length).unsqueeze(1),
                "laps": completed.float().unsqueeze(1),
                "lap_time": first_lap_time.unsqueeze(1),
                "done": (crashed | truncated).unsqueeze(1),
                "terminated": crashed.unsqueeze(1),
                "truncated": truncated.unsqueeze(1),
            }
        )
        return out

    def speed_limit(self) -> torch.Tensor:
        """Each car's speed limit (m/s) where it is now: the speed limiter's (module docstring)."""
        limiter = self.speed_limiter
        if limiter is None:
            raise RuntimeError("this RacingEnv has no speed limiter (speed_limiter=None)")
        # The grip it can count on: with a range of cars, the least of them.
        grip = limiter.margin * (self.grip if self.grip_range is None else self.grip_range[0])
        ahead = self.arc.unsqueeze(1) + self.limiter_ahead
        curvature = self.circuits.interpolate(self.circuits.curvature, self.circuit, ahead)
        # The squared speed from which braking reaches each read point's corner speed by that point.
        reach = grip / curvature.abs().clamp_min(1e-9) + 2 * limiter.braking * self.limiter_ahead
        beyond = grip * limiter.unseen_radius + 2 * limiter.braking * limiter.horizon
        return reach.min(1).values.clamp_max(beyond).sqrt()

    def _set_seed(self, seed: int | None) -> None:
        seed = 0 if seed is None else seed
        self.stream.copy_(torch.arange(self.batch_size[0], device=self.device) + seed)
        self.draws.zero_()
        self._assign_circuits_per_env()


@torch.no_grad()
def _macro_blocks(pixels: float) -> int:
    """``pixels`` rounded up to whole 16-pixel macro-blocks of a video codec."""
    return int(math.ceil(pixels / 16)) * 16


def drive_episodes(
    env: RacingEnv, policy: Callable[[TensorDictBase], TensorDictBase], trace: bool = False
) -> dict[str, torch.Tensor]:
    """One whole episode per car of ``env`` (from a fresh reset) under ``policy``: per car, the summed ``reward`` and
    episode metrics (``progress``, ``laps``, ``lap_time`` of the first lap), the largest |lateral error|
    (``worst_lateral``), the steps driven (``steps``) and those off the track (``off_track``); with ``trace``, every
    car's position after each step (``xy [steps, cars, 2]``, frozen once its episode ended)."""
    cars = env.batch_size[0]
    totals = {key: torch.zeros(cars, device=env.device) for key in ("reward", *env.episode_metric_keys)}
    worst = torch.zeros(cars, device=env.device)
    steps, off = torch.zeros(cars, device=env.device), torch.zeros(cars, device=env.device)
    running = torch.ones(cars, dtype=torch.bool, device=env.device)
    positions = []
    td = env.reset()
    while bool(running.any()):
        td = env.step(policy(td))
        nxt = td["next"]
        for key, total in totals.items():
            total += nxt[key].view(-1) * running
        lateral = env.lateral_of(nxt["observation"]).abs()
        worst = torch.maximum(worst, lateral * running)
        steps += running
        off += (lateral > env.width / 2) & running
        if trace:
            here = torch.stack((env.x, env.y), 1)
            positions.append(torch.where(running.unsqueeze(1), here, positions[-1] if positions else here))
        running &= ~nxt["done"].view(-1)
        td = nxt
    result = {**totals, "worst_lateral": worst, "steps": steps, "off_track": off}
    if trace:
        result["xy"] = torch.stack(positions)
    return result


def episode_summary(result: dict[str, torch.Tensor], width: float) -> dict[str, float]:
    """The means a report quotes from :func:`drive_episodes`: return, laps per episode, the first lap's time over
    the cars that completed one (NaN if none did), the share that completed it and the share never off the track."""
    completed = result["lap_time"] > 0
    return {
        "return_mean": result["reward"].mean().item(),
        "laps_mean": result["laps"].mean().item(),
        "lap_time_mean": result["lap_time"][completed].mean().item() if bool(completed.any()) else float("nan"),
        "lap_completed": completed.float().mean().item(),
        "never_off_track": (result["worst_lateral"] <= width / 2).float().mean().item(),
    }
