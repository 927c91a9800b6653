"""Token observations (MettaGrid's format): what a model needs to know to decode them into a grid.

A token is three bytes ``[location, feature id, value]``: ``location`` packs the cell of the agent's egocentric view
as ``row << 4 | col``, 0xFE marks agent-wide tokens (not tied to a cell), and 0xFF in all three bytes is padding.
An environment with token observations describes them with an :class:`ObservationLayout`
(``env.observation_layout``); the data module hands it on, and a token model (``RecurrentPPO``) checks its grid
against it and takes the per-feature scale.
"""

from __future__ import annotations

from dataclasses import dataclass

GLOBAL_LOCATION = 0xFE


@dataclass(frozen=True)
class ObservationLayout:
    """How to read the tokens: view size, feature names by id, each feature's normalisation (values divided by it
    land in about [0, 1]), and the object type named by each value of a ``tag`` feature (none: ``()``)."""

    height: int
    width: int
    feature_names: tuple[str, ...]
    normalization: tuple[float, ...]
    tag_names: tuple[str, ...] = ()
    global_location: int = GLOBAL_LOCATION

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def scale(self) -> tuple[float, ...]:
        return tuple(1.0 / n for n in self.normalization)
