"""The stress set: hand-drawn circuits with what the generator rarely makes, for evaluation only.

The generator (:mod:`envs.racing.circuits`) draws rings of control points at random radii: its corners are smooth
and seldom tighter than a few times its ``min_radius``, its straights are short. A policy that has only seen those
may be fast there and still leave the road at a chicane on a straight, a hairpin, or a bend that tightens. These
circuits hold such features on purpose. They are written once here, never drawn by a training source (a
:class:`~envs.racing.circuits.TrackSource` only draws from the generator), and driven both ways by
``benchmarks/racing_generalisation.py`` beside the generator's held-out split.

A circuit is written as a driver reads it: a start heading east at the origin, then straights and constant-radius
bends (``("left", degrees, radius)``, ``("right", …)``, ``("straight", metres)``). :func:`course_points` walks it and
places a control point every few metres, so the track's B-spline follows the drawn line closely; each drawing closes
(ends where it started, heading east again: tested).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Segment = tuple  # ("straight", metres) or ("left" | "right", degrees, radius in metres)
CLOSURE = 0.05  # metres between a course's end and its start

#: A 200 m straight with a chicane in its middle: right, left, right within 60 m, at speed.
CHICANE_STRAIGHT: tuple[Segment, ...] = (
    ("straight", 70.0),
    ("right", 30.0, 20.0),
    ("left", 60.0, 20.0),
    ("right", 30.0, 20.0),
    ("straight", 70.0),
)

#: Name → the course, anticlockwise. Radii are of the centre line; the road is 4 m wide.
STRESS_CIRCUITS: dict[str, tuple[Segment, ...]] = {
    # Two long straights joined by 180° hairpins of 10 m: full braking from top speed into the tightest corners.
    "paperclip": (
        ("straight", 160.0),
        ("left", 180.0, 10.0),
        ("straight", 160.0),
        ("left", 180.0, 10.0),
    ),
    # An oval whose two straights each hold a chicane.
    "chicanes": (*CHICANE_STRAIGHT, ("left", 180.0, 30.0), *CHICANE_STRAIGHT, ("left", 180.0, 30.0)),
    # A half-turn whose radius falls from 60 m to 30 m to 14 m: a car that enters at the first radius's speed runs
    # wide. Driven the other way it opens instead. Then back along a straight and round a 33.5 m half-turn.
    "tightening": (
        ("straight", 150.0),
        ("left", 60.0, 60.0),
        ("left", 60.0, 30.0),
        ("left", 60.0, 14.0),
        ("straight", 150.0 + (60.0 - 14.0) * math.sin(math.radians(60))),  # back to x = 0
        ("left", 180.0, 33.5),  # down the 67 m the half-turn climbed
    ),
    # Esses: four alternating 90° bends of 18–25 m in a row, then two wide half-turns back to the start.
    "esses": (
        ("straight", 60.0),
        ("left", 90.0, 20.0),
        ("right", 90.0, 18.0),
        ("left", 90.0, 25.0),
        ("right", 90.0, 18.0),
        ("straight", 40.0),
        ("left", 180.0, 30.0),
        ("straight", 181.0),  # back to x = 0
        ("left", 180.0, 70.5),  # down the 81 m the esses climbed and the 60 m of the first half-turn
    ),
}


def course_points(course: Sequence[Segment], spacing: float = 5.0) -> list[tuple[float, float]]:
    """Control points (m) every ``spacing`` m or less along ``course``, from the origin heading east. A course must
    end where it started, heading east (within :data:`CLOSURE` m and a degree): otherwise the closed spline would
    join its ends with a kink the drawing does not have."""
    x = y = heading = 0.0
    points = [(x, y)]
    for segment in course:
        kind = segment[0]
        if kind == "straight":
            length = float(segment[1])
            steps = max(1, math.ceil(length / spacing))
            for _ in range(steps):
                x += length / steps * math.cos(heading)
                y += length / steps * math.sin(heading)
                points.append((x, y))
        elif kind in ("left", "right"):
            degrees, radius = float(segment[1]), float(segment[2])
            turn = math.radians(degrees) * (1 if kind == "left" else -1)
            steps = max(1, math.ceil(abs(turn) * radius / spacing), math.ceil(abs(degrees) / 30))
            for _ in range(steps):
                # The chord of each small arc: rotate the heading by half the step, advance, rotate the other half.
                step = turn / steps
                chord = 2 * radius * math.sin(abs(step) / 2)
                heading += step / 2
                x += chord * math.cos(heading)
                y += chord * math.sin(heading)
                heading += step / 2
                points.append((x, y))
        else:
            raise ValueError(f"a course segment is ('straight', m) or ('left' | 'right', degrees, radius): {segment}")
    gap = math.dist(points[0], points[-1])
    if gap > CLOSURE or abs(math.remainder(heading, 2 * math.pi)) > math.radians(1):
        raise ValueError(
            f"the course does not close: it ends {gap:.2f} m from its start, heading {math.degrees(heading):.1f}°"
        )
    return points[:-1]  # the end is the start
