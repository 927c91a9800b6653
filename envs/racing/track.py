"""A closed race track: a smooth centre line of constant width, sampled by arc length for fast batched lookups.

The centre line is the periodic uniform cubic B-spline of a ring of control points. A cubic B-spline is twice
continuously differentiable, so the curvature — which sets a car's cornering speed limit — is continuous, with no
jumps at the joints (a Catmull-Rom spline through the points would have them). The curve passes near, not through,
the control points. It is sampled every ``resolution`` metres of arc length; positions, headings and curvatures
between samples are interpolated.

``DEFAULT_CIRCUIT`` is the default layout: a 450 m anticlockwise circuit: a 100 m straight, a long left turn at its
end (the tightest radius, 18.7 m), an S-bend and a wide left loop back to the straight. Any other ring of control
points is a track too (``RacingEnv(control_points=...)``), as long as it does not fold over itself: the tightest
radius must exceed half the width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

#: Control points (m) of the default circuit, anticlockwise.
DEFAULT_CIRCUIT: tuple[tuple[float, float], ...] = (
    (0.0, 0.0),
    (50.0, 0.0),
    (100.0, 0.0),
    (135.0, 10.0),
    (145.0, 40.0),
    (120.0, 60.0),
    (90.0, 50.0),
    (65.0, 60.0),
    (55.0, 90.0),
    (20.0, 100.0),
    (-15.0, 85.0),
    (-35.0, 55.0),
    (-35.0, 20.0),
    (-20.0, 2.0),
)

_SAMPLES_PER_SEGMENT = 256  # dense spline samples per control-point segment, before resampling by arc length


def _bspline(points: torch.Tensor, samples: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions, first and second derivatives ``[K * samples, 2]`` of the closed uniform cubic B-spline."""
    t = torch.arange(samples, dtype=torch.float64) / samples
    # The uniform cubic B-spline basis and its derivatives on one segment.
    basis = torch.stack(((1 - t) ** 3, 3 * t**3 - 6 * t**2 + 4, -3 * t**3 + 3 * t**2 + 3 * t + 1, t**3), 1) / 6
    d1 = torch.stack((-((1 - t) ** 2), 3 * t**2 - 4 * t, -3 * t**2 + 2 * t + 1, t**2), 1) / 2
    d2 = torch.stack((1 - t, 3 * t - 2, -3 * t + 1, t), 1)
    count = points.shape[0]
    # Segment i is shaped by points i-1, i, i+1, i+2 (indices around the ring).
    rings = torch.stack([points.roll(1 - j, 0) for j in range(4)], 1)  # [K, 4, 2]
    position, first, second = (
        torch.einsum("sj,kjc->ksc", m, rings).reshape(count * samples, 2) for m in (basis, d1, d2)
    )
    return position, first, second


class Track:
    """A closed centre line of constant width, sampled every ``resolution`` m of arc length.

    Args:
        control_points: ``K >= 4`` points (m) around the ring, in driving order.
        width: track width (m); the car is on the track while its distance from the centre line is ≤ width / 2.
        resolution: metres between the stored samples.

    Attributes (CPU float32 tensors; :meth:`to` moves them): ``xy [S + 1, 2]`` positions, ``heading [S + 1]``
    unwrapped tangent angles (rad), ``curvature [S + 1]`` (1/m, positive turning left); sample ``S`` closes the loop
    (sample 0 one lap on, its heading 2π·winding further). ``length`` is the lap length (m).
    """

    def __init__(
        self,
        control_points: Sequence[Sequence[float]] = DEFAULT_CIRCUIT,
        width: float = 4.0,
        resolution: float = 0.25,
    ) -> None:
        points = torch.as_tensor(control_points, dtype=torch.float64)
        if points.ndim != 2 or points.shape[1] != 2 or points.shape[0] < 4:
            raise ValueError(f"control_points must be at least 4 (x, y) points, got shape {tuple(points.shape)}")
        if not width > 0:
            raise ValueError(f"width must be > 0, got {width}")
        if not resolution > 0:
            raise ValueError(f"resolution must be > 0, got {resolution}")
        repeated = ((points - points.roll(-1, 0)).norm(dim=1) < 1e-9).nonzero().flatten().tolist()
        if repeated:
            i = repeated[0]
            raise ValueError(
                f"control_points {i} and {(i + 1) % points.shape[0]} are the same point: {points[i].tolist()}"
            )
        self.width, self.resolution, self.requested_resolution = float(width), float(resolution), float(resolution)
        self.control_points = tuple(tuple(float(c) for c in point) for point in points.tolist())
        position, first, second = _bspline(points, _SAMPLES_PER_SEGMENT)
        speed = first.norm(dim=1)
        if bool((speed < 1e-9).any()):
            raise ValueError("control_points make the centre line stop and turn back (a cusp)")
        curvature = (first[:, 0] * second[:, 1] - first[:, 1] * second[:, 0]) / speed**3
        # Arc length along the dense samples (closing the loop), then resampling at whole multiples of `resolution`.
        closed = torch.cat((position, position[:1]))
        arc = torch.cat((torch.zeros(1, dtype=torch.float64), (closed[1:] - closed[:-1]).norm(dim=1).cumsum(0)))
        count = max(int(round(float(arc[-1]) / resolution)), 8)
        self.resolution = float(arc[-1]) / count  # an exact divisor of the lap, so the samples close the loop
        self.length = float(arc[-1])
        targets = torch.arange(count + 1, dtype=torch.float64) * self.resolution
        index = torch.searchsorted(arc, targets, right=True).clamp(1, arc.shape[0] - 1) - 1
        frac = ((targets - arc[index]) / (arc[index + 1] - arc[index])).unsqueeze(1)
        xy = torch.lerp(closed[index], closed[index + 1], frac)
        tangent = torch.cat((first, first[:1]))
        heading = torch.atan2(tangent[:, 1], tangent[:, 0])
        heading = _unwrap(
            torch.lerp(heading[index], heading[index] + _wrap(heading[index + 1] - heading[index]), frac[:, 0])
        )
        kappa = torch.cat((curvature, curvature[:1]))
        kappa = torch.lerp(kappa[index], kappa[index + 1], frac[:, 0])
        tightest = 1.0 / float(kappa.abs().max())
        if tightest <= width / 2:
            raise ValueError(
                f"the track folds over itself: its tightest radius, {tightest:.2f} m, is not more than half its "
                f"width ({width / 2:g} m); spread the control points or narrow the track"
            )
        self.min_radius = tightest
        self.xy, self.heading, self.curvature = xy.float(), heading.float(), kappa.float()

    def to(self, device: torch.device | str) -> Track:
        self._circuits = None
        self.xy, self.heading, self.curvature = (t.to(device) for t in (self.xy, self.heading, self.curvature))
        return self

    @property
    def samples(self) -> int:
        """Stored samples per lap (``S``)."""
        return self.xy.shape[0] - 1

    def at(self, arc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Centre-line position ``[..., 2]``, heading and curvature at arc lengths ``arc`` (m, any shape, any lap)."""
        return self._alone().at(torch.zeros(arc.shape, dtype=torch.long, device=arc.device), arc)

    def project(self, xy: torch.Tensor, arc: torch.Tensor, window: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The arc length of the centre-line point nearest to each position ``xy [N, 2]``, searched within ``window``
        m of the previous arc lengths ``arc [N]``, and the signed distance from it (m, positive to the left)."""
        return self._alone().project(torch.zeros(arc.shape, dtype=torch.long, device=arc.device), xy, arc, window)

    def _alone(self) -> Circuits:
        # This track as a set of one, so that one implementation serves single and per-car lookups; rebuilt when
        # `to` moved the samples.
        alone = getattr(self, "_circuits", None)
        if alone is None or alone.xy.device != self.xy.device:
            alone = self._circuits = Circuits([self])
        return alone

    def reversed(self) -> Track:
        """The same circuit driven the other way (its control points in reverse order)."""
        return Track(self.control_points[::-1], self.width, self.requested_resolution)


class Circuits:
    """Several tracks stacked for batched lookups: each car reads its own circuit (``circuit``, indices into
    ``tracks``) with tensor ops only.

    Each track keeps its own samples (about ``resolution`` m apart, an exact divisor of its lap); the tensors are
    padded to the longest track's sample count, so a lookup is one gather whatever the mix of circuits, and a track's
    padding is never read (indices wrap at its own sample count). Attributes: ``xy [T, S + 1, 2]``, ``heading`` and
    ``curvature [T, S + 1]`` and, per track, ``length``, ``resolution`` (float32) and ``samples`` (int64) ``[T]``.
    """

    def __init__(self, tracks: Sequence[Track]) -> None:
        if not tracks:
            raise ValueError("Circuits needs at least one track")
        self.tracks = list(tracks)
        count = max(track.samples for track in self.tracks) + 1

        def padded(values: torch.Tensor) -> torch.Tensor:
            return torch.cat((values, values[-1:].expand(count - values.shape[0], *values.shape[1:])))

        self.xy = torch.stack([padded(track.xy) for track in self.tracks])
        self.heading = torch.stack([padded(track.heading) for track in self.tracks])
        self.curvature = torch.stack([padded(track.curvature) for track in self.tracks])
        device = self.xy.device
        self.length = torch.tensor([track.length for track in self.tracks], device=device)
        self.resolution = torch.tensor([track.resolution for track in self.tracks], device=device)
        self.samples = torch.tensor([track.samples for track in self.tracks], device=device)
        self.finest = min(track.resolution for track in self.tracks)  # sets the projection's search reach

    def __len__(self) -> int:
        return len(self.tracks)

    def to(self, device: torch.device | str) -> Circuits:
        for name in ("xy", "heading", "curvature", "length", "resolution", "samples"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def interpolate(self, values: torch.Tensor, circuit: torch.Tensor, arc: torch.Tensor) -> torch.Tensor:
        """``values [T, S + 1, ...]`` (a quantity sampled like the tracks) at arc lengths ``arc`` (m, any lap) of the
        circuits ``circuit`` (indices, broadcast over ``arc``'s trailing dimensions)."""
        circuit = circuit.view(*circuit.shape, *(1,) * (arc.ndim - circuit.ndim)).expand(arc.shape)
        position = torch.remainder(arc, self.length[circuit]) / self.resolution[circuit]
        index = torch.minimum(position.long(), self.samples[circuit] - 1)
        frac = position - index
        if values.ndim > 2:
            frac = frac.unsqueeze(-1)
        return torch.lerp(values[circuit, index], values[circuit, index + 1], frac)

    def at(self, circuit: torch.Tensor, arc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Centre-line position ``[..., 2]``, heading and curvature of circuits ``circuit`` at arc lengths ``arc``."""
        return tuple(self.interpolate(values, circuit, arc) for values in (self.xy, self.heading, self.curvature))

    def project(
        self, circuit: torch.Tensor, xy: torch.Tensor, arc: torch.Tensor, window: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For cars on circuits ``circuit [N]``: the arc length of the centre-line point nearest to each position
        ``xy [N, 2]``, searched within ``window`` m of the previous arc lengths ``arc [N]``, and the signed distance
        from it (m, positive to the left)."""
        reach = int(math.ceil(window / self.finest))
        offsets = torch.arange(-reach, reach + 1, device=arc.device)
        resolution, row = self.resolution[circuit], circuit.unsqueeze(1)
        start = (arc / resolution).round().long().unsqueeze(1)
        index = torch.remainder(start + offsets, self.samples[row])
        distance = (self.xy[row, index] - xy.unsqueeze(1)).square().sum(-1)
        nearest = index.gather(1, distance.argmin(1, keepdim=True)).squeeze(1)
        # Refine along the tangent at the nearest sample: continuous arc length, signed lateral offset.
        delta = xy - self.xy[circuit, nearest]
        heading = self.heading[circuit, nearest]
        along = delta[:, 0] * torch.cos(heading) + delta[:, 1] * torch.sin(heading)
        lateral = -delta[:, 0] * torch.sin(heading) + delta[:, 1] * torch.cos(heading)
        return torch.remainder(nearest * resolution + along, self.length[circuit]), lateral


def _wrap(angle: torch.Tensor) -> torch.Tensor:
    """Angles in [−π, π)."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def _unwrap(angle: torch.Tensor) -> torch.Tensor:
    """A sequence of angles made continuous (no 2π jumps between neighbours)."""
    return angle[0] + torch.cat((torch.zeros(1, dtype=angle.dtype), _wrap(angle.diff()).cumsum(0)))


def wrap_angle(angle: torch.Tensor) -> torch.Tensor:
    """Angles in [−π, π): the difference of two headings as a turn."""
    return _wrap(angle)
