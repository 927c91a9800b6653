"""Procedural circuits: a seeded generator of valid closed tracks, and the track sources a racing env draws from.

**Generator.** A circuit is a ring of ``points`` control points at increasing angles around an origin (evenly spaced,
each shifted by up to ``jitter`` of the spacing) and random radii within ``radius``; the closed B-spline of
:class:`~envs.racing.track.Track` through them is the centre line. Radii that differ between neighbours
give the straights, hairpins and S-bends. ``stretch`` scales the ring along one axis by a random factor: the
sides it lengthens become long straights and the ends it leaves become tight corners, as on circuits built around a
main straight. A draw is kept only if the track passes the track's own checks (no fold),
its tightest radius is at least ``min_radius`` and no two parts of the road come closer than ``clearance`` m plus the
road's width and run-off on both sides (a car could otherwise cross onto another part of the circuit); otherwise the
same random stream draws again. The stream is numpy's PCG64 seeded by ``(seed, split, index)``, so a circuit is a
pure function of those three numbers.

**Sources** (``RacingEnv(tracks={...})``): the circuits an environment's cars drive. ``split: train`` is a pool of
``pool`` circuits ``(seed, 0, 0 … pool − 1)``; ``split: held_out`` is ``held_out`` circuits ``(seed, 1, 0 …)``, a
seed stream that training never draws (the split is part of the seed, so the sets are disjoint by construction);
``split: validation`` is ``held_out`` circuits more ``(seed, 2, 0 …)``, for choosing among a run's checkpoints
during training, so that the held-out circuits stay a test set that nothing in training has looked at.
``split: stress`` is not drawn: it is the hand-drawn circuits of :mod:`envs.racing.stress_circuits` (hairpins,
chicanes, a tightening bend), a second test set with what the generator rarely makes.
``directions: both`` adds each circuit driven the other way; ``reversed`` keeps only that. ``per: episode`` draws a
circuit of the set at every reset of a car; ``per: env`` gives car ``i`` (stream ``seed + i``) circuit ``(seed + i)
mod count`` for good, which also spreads an evaluation's cars evenly over a held-out set.

Why a pool rather than a fresh circuit at every reset: building a track (spline, arc-length resampling, checks) and
its expert's speed profile is CPU work of a few milliseconds; drawing an index into tensors built once keeps a reset
a tensor op (no host sync on a GPU) and makes the environment's state a few integers, which checkpoints save.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from envs.racing.stress_circuits import STRESS_CIRCUITS, course_points
from envs.racing.track import Track

SPLITS = {"train": 0, "held_out": 1, "validation": 2, "stress": None}  # the second number of a circuit's seed
DIRECTIONS = ("forward", "reversed", "both")
PER = ("episode", "env")


@dataclass(frozen=True)
class CircuitGenerator:
    """Random valid circuits.

    Args:
        points: the range of control points per circuit (inclusive).
        radius: the range of the control points' distances from the circuit's centre (m).
        jitter: how far each control point's angle may move from even spacing, as a fraction of the spacing (< 0.5
            keeps the angles increasing).
        min_radius: the tightest corner allowed (m).
        clearance: metres between the run-offs of two parts of the circuit that pass each other.
        stretch: the range of the factor the ring is scaled by along its x axis (``[1, 1]``: none; the draws of
            the other options are the same either way).
        attempts: draws per circuit before giving up (an impossible combination of options).
    """

    points: tuple[int, int] = (8, 14)
    radius: tuple[float, float] = (35.0, 100.0)
    jitter: float = 0.35
    min_radius: float = 12.0
    clearance: float = 4.0
    stretch: tuple[float, float] = (1.0, 1.0)
    attempts: int = 200

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", tuple(int(p) for p in self.points))
        object.__setattr__(self, "radius", tuple(float(r) for r in self.radius))
        object.__setattr__(self, "stretch", tuple(float(s) for s in self.stretch))
        if len(self.points) != 2 or not 4 <= self.points[0] <= self.points[1]:
            raise ValueError(f"tracks.generator.points must be [low, high] with 4 <= low <= high, got {self.points}")
        if len(self.radius) != 2 or not 0 < self.radius[0] <= self.radius[1]:
            raise ValueError(f"tracks.generator.radius must be [low, high] with 0 < low <= high, got {self.radius}")
        if len(self.stretch) != 2 or not 1 <= self.stretch[0] <= self.stretch[1]:
            raise ValueError(f"tracks.generator.stretch must be [low, high] with 1 <= low <= high, got {self.stretch}")
        if not 0 <= self.jitter < 0.5:
            raise ValueError(f"tracks.generator.jitter must be in [0, 0.5), got {self.jitter}")
        if not self.min_radius > 0 or self.clearance < 0 or self.attempts < 1:
            raise ValueError(
                "tracks.generator: min_radius must be > 0, clearance >= 0 and attempts >= 1, got "
                f"{self.min_radius}, {self.clearance}, {self.attempts}"
            )

    def control_points(self, rng: np.random.Generator) -> np.ndarray:
        """One ring of control points ``[K, 2]``, anticlockwise (not checked)."""
        count = int(rng.integers(self.points[0], self.points[1] + 1))
        angles = 2 * math.pi * (np.arange(count) + self.jitter * rng.uniform(-1, 1, count)) / count
        radii = rng.uniform(*self.radius, count)
        points = np.stack((radii * np.cos(angles), radii * np.sin(angles)), 1)
        if self.stretch[1] > 1:  # drawn only when asked: the circuits without a stretch stay those of before
            points[:, 0] *= rng.uniform(*self.stretch)
        return points

    def circuit(self, seed: Sequence[int], width: float, runoff: float) -> Track:
        """The first valid circuit of the random stream ``seed`` for a road ``width`` m wide with ``runoff`` m."""
        rng = np.random.default_rng(list(seed))
        for _ in range(self.attempts):
            points = self.control_points(rng)
            try:
                track = Track(points.tolist(), width)
            except ValueError:  # folds over itself
                continue
            if track.min_radius >= self.min_radius and self.gap(track) >= width + 2 * runoff + self.clearance:
                return track
        raise ValueError(
            f"tracks.generator: no valid circuit in {self.attempts} draws for seed {list(seed)}; widen radius or "
            "lower min_radius or clearance"
        )

    @staticmethod
    def gap(track: Track) -> float:
        """The smallest distance (m) between centre-line points that are far apart along the track: how close two
        different parts of the circuit come. Points within ``reach`` m of each other along the track are the same
        part of the road."""
        step = max(1, round(1.0 / track.resolution))  # about a metre apart: fine enough for a 4 m road
        xy = track.xy[:-1:step].double()
        arc = torch.arange(xy.shape[0], dtype=torch.float64) * step * track.resolution
        along = (arc[:, None] - arc[None, :]).abs()
        along = torch.minimum(along, track.length - along)
        # On a corner of radius R two points s apart along it are 2R sin(s / 2R) apart: beyond half a turn of the
        # tightest corner they may come close only if the road really comes back.
        reach = math.pi * track.min_radius
        distance = torch.cdist(xy, xy)
        far = along > reach
        return float(distance[far].min()) if bool(far.any()) else math.inf


@dataclass(frozen=True)
class TrackSource:
    """A racing env's ``tracks`` option, checked (the module docstring)."""

    generator: CircuitGenerator = field(default_factory=CircuitGenerator)
    seed: int = 0
    per: str = "episode"
    split: str = "train"
    pool: int = 256
    held_out: int = 8
    directions: str = "forward"

    @staticmethod
    def parse(options: Mapping[str, Any]) -> TrackSource:
        if not isinstance(options, Mapping):
            raise ValueError(f"tracks must be a mapping of options (generator, seed, per, …), got {options!r}")
        known = {name for name in TrackSource.__dataclass_fields__}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"tracks.{unknown[0]}: unknown option; the options are {', '.join(sorted(known))}")
        generator = options.get("generator") or {}
        if not isinstance(generator, Mapping):
            raise ValueError(f"tracks.generator must be a mapping of CircuitGenerator options, got {generator!r}")
        fields = set(CircuitGenerator.__dataclass_fields__)
        wrong = sorted(set(generator) - fields)
        if wrong:
            raise ValueError(
                f"tracks.generator.{wrong[0]}: unknown option; the options are {', '.join(sorted(fields))}"
            )
        source = TrackSource(**{**options, "generator": CircuitGenerator(**generator)})
        if source.per not in PER:
            raise ValueError(f"tracks.per must be one of {', '.join(PER)}, got {source.per!r}")
        if source.split not in SPLITS:
            raise ValueError(f"tracks.split must be one of {', '.join(SPLITS)}, got {source.split!r}")
        if source.directions not in DIRECTIONS:
            raise ValueError(f"tracks.directions must be one of {', '.join(DIRECTIONS)}, got {source.directions!r}")
        for name in ("pool", "held_out"):
            if int(getattr(source, name)) < 1:
                raise ValueError(f"tracks.{name} must be >= 1, got {getattr(source, name)}")
        return source

    @property
    def count(self) -> int:
        """Circuits of the split, before directions."""
        if self.split == "stress":
            return len(STRESS_CIRCUITS)
        return self.pool if self.split == "train" else self.held_out  # held_out sizes the validation split too

    def seeds(self) -> list[tuple[int, int, int]]:
        """The random streams of the split's circuits (none for the stress set: it is drawn by hand)."""
        if self.split == "stress":
            return []
        return [(self.seed, SPLITS[self.split], index) for index in range(self.count)]

    def tracks(self, width: float, runoff: float) -> list[Track]:
        """The split's circuits (each then its reverse, with ``directions: both``)."""
        if self.split == "stress":
            return list(_stress_tracks(self.directions, width))
        return list(_tracks(json.dumps(self.generator.__dict__), tuple(self.seeds()), self.directions, width, runoff))


def _both_ways(tracks: list[Track], directions: str) -> tuple[Track, ...]:
    """``tracks`` as driven in ``directions``: each, its reverse, or each then its reverse."""
    driven = []
    for track in tracks:
        if directions in ("forward", "both"):
            driven.append(track)
        if directions in ("reversed", "both"):
            driven.append(track.reversed())
    return tuple(driven)


@functools.lru_cache(maxsize=8)
def _tracks(generator: str, seeds: tuple, directions: str, width: float, runoff: float) -> tuple[Track, ...]:
    # Cached: a run builds several environments of the same options (the probe for the specs, the collection, the
    # evaluation, the expert's), and a pool takes a second or so to build.
    maker = CircuitGenerator(**json.loads(generator))
    return _both_ways([maker.circuit(seed, width, runoff) for seed in seeds], directions)


@functools.lru_cache(maxsize=4)
def _stress_tracks(directions: str, width: float) -> tuple[Track, ...]:
    return _both_ways([Track(course_points(course), width) for course in STRESS_CIRCUITS.values()], directions)
