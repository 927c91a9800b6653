"""What the environments' ``render`` share: grid worlds drawn cell by cell, and filled shapes on a pixel canvas.

Plain NumPy: a frame is drawn once per step of a recorded episode, on the CPU, whatever device the batch lives on.
"""

from __future__ import annotations

import numpy as np


def palette(*colours: tuple[int, int, int]) -> np.ndarray:
    """RGB colours as a uint8 table ``[len(colours), 3]``, indexed by a grid's colour ids."""
    return np.asarray(colours, dtype=np.uint8).reshape(-1, 3)


def grid_image(colour_ids: np.ndarray, colours: np.ndarray, cell: int) -> np.ndarray:
    """A grid of colour ids ``[rows, cols]`` as an RGB image ``[rows * cell, cols * cell, 3]``: each cell a square of
    ``cell`` pixels in its colour (row 0 at the top)."""
    return np.ascontiguousarray(colours[colour_ids].repeat(cell, axis=0).repeat(cell, axis=1))


def fill_polygon(image: np.ndarray, corners: np.ndarray, colour: tuple[int, int, int] | np.ndarray) -> None:
    """Paint the convex polygon ``corners`` (``[k, 2]`` pixel coordinates as (column, row), in order around it) into
    ``image`` in place: every pixel whose centre lies inside it. Parts outside the image are cut off."""
    height, width = image.shape[:2]
    low = np.clip(np.floor(corners.min(0)).astype(int), 0, [width - 1, height - 1])
    high = np.clip(np.ceil(corners.max(0)).astype(int), 0, [width - 1, height - 1])
    cols, rows = np.meshgrid(np.arange(low[0], high[0] + 1) + 0.5, np.arange(low[1], high[1] + 1) + 0.5)
    edges = np.roll(corners, -1, axis=0) - corners
    # The sign of each edge's cross product with the pixel: all alike (either way round) means inside.
    cross = [
        edge[0] * (rows - start[1]) - edge[1] * (cols - start[0]) for start, edge in zip(corners, edges, strict=True)
    ]
    inside = np.all([c >= 0 for c in cross], axis=0) | np.all([c <= 0 for c in cross], axis=0)
    image[low[1] : high[1] + 1, low[0] : high[0] + 1][inside] = colour
