"""Snake as a batched TorchRL environment: thousands of boards stepped by a few tensor ops, on CPU or CUDA.

Rules (docs/reference_systems.md §1):

- a ``size``×``size`` board; the snake starts with 3 blocks in a straight line, at least ``spawn_margin`` cells
  from the border (by default 3, or the largest that fits on a small board), at a random position and heading;
- 4 absolute actions: 0 up, 1 right, 2 down, 3 left; an action that reverses the heading keeps going straight;
- reward +1 for eating (the snake grows by one block), −1 for dying (wall or own body), 0 otherwise; moving into
  the cell the tail leaves on this step is legal;
- food appears uniformly on an empty cell, never on the body; a full board ends the episode (terminated);
- episodes are truncated after ``max_steps`` steps; each environment resets on its own.

Observation: ``uint8`` planes ``(3, size, size)`` — body (every snake cell, head included), head, food. An MLP
flattens them and a CNN reads them as channels; uint8 keeps replay buffers 4× smaller than float32.

Speed: every step is O(1) work per environment. The observation planes *are* the state and are edited in place
(head, tail and food cells only) through flat indices; writes an environment must skip go to a scratch byte at the
end of its row, so no old value is read back. A ring buffer of body cells gives the tail in O(1). Two backends
play identical games: ``torch`` updates every board under masks (fixed shapes, no host sync: the CUDA path), and
``cpp`` (``cpu_kernel.py``, the CPU default) runs the same rules as one compiled loop over the boards.

Randomness is counter-based: environment ``i`` of a batch seeded with ``seed`` draws from a hash of
``(seed + i, its own draw counter, slot)``. A batch of N environments therefore replays exactly the games of N
single environments seeded ``seed … seed + N − 1`` under the same actions, and the whole random state is two
integer buffers that ``state_dict`` saves with the rest.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from envs.base import BatchedEnv, MaskedResets
from envs.counter_rng import random_bits
from envs.drawing import grid_image, palette
from envs.snake import cpu_kernel

# Row and column offsets of the 4 absolute actions: up, right, down, left.
_DROW = (-1, 0, 1, 0)
_DCOL = (0, 1, 0, -1)
# Candidate cells drawn per food placement before falling back to an exhaustive draw; with the board half full,
# all 16 candidates miss with probability 2^-16.
_FOOD_CANDIDATES = 16
# The reference's margin on its 10x10 board; smaller boards get the largest margin that fits.
_DEFAULT_SPAWN_MARGIN = 3
#: ``render``'s colours: empty cell, body, head, food (the ids the board's planes give a cell).
RENDER_COLOURS = palette((24, 24, 32), (40, 160, 60), (250, 220, 40), (220, 50, 50))
#: pixels per board cell in ``render``: a multiple of 16, so a board is whole macro-blocks of a video codec.
RENDER_CELL = 16


class SnakeEnv(MaskedResets, BatchedEnv):
    """Batched Snake. All state lives in registered buffers, so ``state_dict`` captures a game exactly.

    Args:
        num_envs: boards stepped together.
        size: board side.
        max_steps: truncation limit per episode.
        spawn_margin: minimum distance of the initial snake from the border. ``None`` (the default): the largest
            margin up to 3 that fits, ``min(3, (size - 3) // 2)``, so a 10×10 board keeps 3 and any board from 3×3
            up works. An explicit value must fit: ``size >= 2 * spawn_margin + 3``.
        seed: base seed; board ``i`` draws from stream ``seed + i``.
        device: where the boards live.
        backend: ``torch`` (tensor ops, any device), ``cpp`` (one compiled loop over the boards, CPU only, the same
            games draw for draw) or ``auto`` (``cpp`` on CPU when it builds, else ``torch``).
        compile_step: the ``torch`` backend's step and reset each compiled by ``torch.compile`` into one graph
            (no host reads, so a CUDA graph can capture them; :class:`~envs.base.BatchedEnv`); the same games as
            eager. It pays where a step is launch-bound (thousands of boards on a GPU); on a CPU the eager step,
            which skips the work no board needs, is faster.
    """

    episode_metric_keys = ("food",)
    can_render = True

    def __init__(
        self,
        num_envs: int = 1,
        size: int = 10,
        max_steps: int = 500,
        spawn_margin: int | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        backend: Literal["auto", "torch", "cpp"] = "auto",
        compile_step: bool = False,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        # Messages start with the argument's name: the command line prefixes the flag path it was given under.
        if size < 3:
            raise ValueError(f"size must be >= 3 to fit the 3-block snake, got {size}")
        if spawn_margin is None:
            spawn_margin = min(_DEFAULT_SPAWN_MARGIN, (size - 3) // 2)
        if spawn_margin < 0:
            raise ValueError(f"spawn_margin must be >= 0, got {spawn_margin}")
        if size < 2 * spawn_margin + 3:
            raise ValueError(
                f"spawn_margin {spawn_margin} leaves no room for the 3-block snake on a {size}x{size} board (size must "
                f"be >= 2 * spawn_margin + 3 = {2 * spawn_margin + 3}); at most {(size - 3) // 2} fits, or leave it "
                "unset"
            )
        if max_steps < 1:
            raise ValueError(f"max_steps must be > 0, got {max_steps}")
        if backend not in ("auto", "torch", "cpp"):
            raise ValueError(f"backend must be auto, torch or cpp, got {backend!r}")
        if compile_step and backend == "cpp":
            raise ValueError(
                "compile_step compiles the torch backend: set backend torch (or auto), or compile_step false"
            )
        super().__init__(batch_size=torch.Size([num_envs]), device=device, compile_step=compile_step)
        self.size, self.cells, self.max_steps, self.spawn_margin = size, size * size, max_steps, spawn_margin
        if backend == "cpp" and self.device.type != "cpu":
            raise ValueError(f"backend 'cpp' runs on the CPU only, got device {self.device}")
        use_kernel = backend != "torch" and self.device.type == "cpu" and not compile_step
        self._kernel = cpu_kernel.load() if use_kernel else None
        if backend == "cpp" and self._kernel is None:
            raise RuntimeError("backend 'cpp': the C++ kernel could not be built (see the warning above)")
        n, dev, cells = num_envs, self.device, size * size
        # Row layout: body plane, head plane, food plane (cells each), then one scratch byte.
        self.scratch = 3 * cells
        self.register_buffer("board", torch.zeros(n, 3 * cells + 1, dtype=torch.uint8, device=dev))
        self.register_buffer("trail", torch.zeros(n, cells + 1, dtype=torch.long, device=dev))  # body ring + scratch
        self.register_buffer("tail_slot", torch.zeros(n, dtype=torch.long, device=dev))  # ring index of the tail
        self.register_buffer("length", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("heading", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("head_row", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("head_col", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("food", torch.zeros(n, dtype=torch.long, device=dev))  # flat cell index, -1: none
        self.register_buffer("steps", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("stream", torch.arange(n, dtype=torch.long, device=dev) + seed)
        self.register_buffer("draws", torch.zeros(n, dtype=torch.long, device=dev))
        self.register_buffer("drow", torch.tensor(_DROW, device=dev), persistent=False)
        self.register_buffer("dcol", torch.tensor(_DCOL, device=dev), persistent=False)
        # The food draw's constant operands (_place_food), made once rather than at every draw.
        self.register_buffer("candidate_index", torch.arange(_FOOD_CANDIDATES, device=dev), persistent=False)
        self.register_buffer("lower_first", cells - 1 - torch.arange(cells, device=dev), persistent=False)
        self.register_buffer("board_base", torch.arange(n, device=dev) * (3 * cells + 1), persistent=False)
        for name, table in zip(("layout_cells", "layout_heading", "layout_board"), self._start_layouts(), strict=True):
            self.register_buffer(name, table.to(dev), persistent=False)
        self.register_buffer("trail_base", torch.arange(n, device=dev) * (cells + 1), persistent=False)

        batch = (n,)
        self.observation_spec = Composite(
            observation=Bounded(0, 1, shape=(*batch, 3, size, size), dtype=torch.uint8, device=dev),
            food=Unbounded(shape=(*batch, 1), device=dev),
            shape=batch,
            device=dev,
        )
        self.action_spec = Categorical(4, shape=batch, device=dev)
        self.reward_spec = Unbounded(shape=(*batch, 1), device=dev)

    def _start_layouts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every legal initial snake: 3 cells in a line, inside the margins, for each heading.

        Returns the cells (tail → head, ``[L, 3]``), the headings ``[L]`` and the board rows ``[L, 3 * cells + 1]``
        (body and head planes set, no food). Each heading has the same number of layouts, so a uniform draw over
        layouts is a uniform heading and then a uniform position.
        """
        lo, hi = self.spawn_margin, self.size - 1 - self.spawn_margin
        cells, headings = [], []
        for heading, (drow, dcol) in enumerate(zip(_DROW, _DCOL, strict=True)):
            for row in range(lo, hi + 1):
                for col in range(lo, hi + 1):
                    body = [(row - back * drow, col - back * dcol) for back in (2, 1, 0)]
                    if all(lo <= r <= hi and lo <= c <= hi for r, c in body):
                        cells.append([r * self.size + c for r, c in body])
                        headings.append(heading)
        cells_t = torch.tensor(cells)
        board = torch.zeros(len(cells), 3 * self.cells + 1, dtype=torch.uint8)
        board.scatter_(1, cells_t, 1)
        board[torch.arange(len(cells)), self.cells + cells_t[:, 2]] = 1
        return cells_t, torch.tensor(headings), board

    # ------------------------------------------------------------------------------------------ randomness
    def _random(self, slots: int, first_slot: int = 0) -> torch.Tensor:
        """32-bit random values ``[num_envs, slots]`` from the boards' streams at their current draw counts."""
        return random_bits(self.stream, self.draws, slots, first_slot)

    def _set_seed(self, seed: int | None) -> None:
        seed = 0 if seed is None else seed
        self.stream.copy_(torch.arange(self.batch_size[0], device=self.device) + seed)
        self.draws.zero_()

    # ---------------------------------------------------------------------------------------------- helpers
    def _set(self, plane: int, cells: torch.Tensor, value: int, where: torch.Tensor) -> None:
        """``plane[cells] = value`` on the boards where ``where`` holds; the others write their scratch byte."""
        offset = torch.where(where, cells + plane * self.cells, self.scratch)
        self.board.view(-1)[self.board_base + offset] = value

    def _observation(self) -> torch.Tensor:
        # clone(): the slice reshapes into a *view* of the live board, and an observation must not move on with it.
        return self.board[:, : self.scratch].reshape(-1, 3, self.size, self.size).clone()

    def render(self, index: int = 0) -> np.ndarray:
        """Board ``index``: ``RENDER_CELL`` pixels a cell, in ``RENDER_COLOURS`` (row 0 at the top)."""
        planes = self.board[self._render_index(index), : self.scratch].view(3, self.size, self.size).cpu().numpy()
        ids = np.where(planes[1] > 0, 2, np.where(planes[0] > 0, 1, np.where(planes[2] > 0, 3, 0)))
        return grid_image(ids, RENDER_COLOURS, RENDER_CELL)

    def _place_food(self, where: torch.Tensor) -> None:
        """Put food on a uniformly drawn empty cell of each board where ``where`` holds (none left: food = −1).

        Computed for every board and kept where ``where`` holds: no data-dependent shapes, so no host sync on a GPU.
        The eager CPU step's two ``any`` checks are free there and skip work that is rarely needed.
        """
        if self.skips_idle_work and not bool(where.any()):
            return
        body = self.board[:, : self.cells]
        candidates = self._random(_FOOD_CANDIDATES) % self.cells
        free = body.gather(1, candidates) == 0
        # The first free candidate is uniform over the free cells, as every candidate is. Its index is a minimum
        # over distinct values, not an argmax over tied ones: which of tied maxima a reduction returns is the
        # kernel's choice (a vectorised compiled one need not return the first).
        first = torch.where(free, self.candidate_index, _FOOD_CANDIDATES - 1).amin(1, keepdim=True)
        choice = candidates.gather(1, first).squeeze(1)
        missed = where & ~free.any(1)
        if not self.skips_idle_work or bool(missed.any()):
            # A crowded board whose 16 candidates all missed draws exhaustively: the free cell with the largest draw,
            # equal draws going to the lower cell (as the C++ kernel's strict comparison does). Each key is unique,
            # so the maximum is, whichever kernel reduces it.
            keys = self._random(self.cells, _FOOD_CANDIDATES) * self.cells + self.lower_first
            best = torch.where(body == 0, keys, -1).amax(1)
            choice = torch.where(missed, torch.where(best >= 0, self.cells - 1 - best % self.cells, -1), choice)
        self.food.copy_(torch.where(where, choice, self.food))
        self._set(2, self.food, 1, where & (self.food >= 0))
        self.draws.add_(where)

    # ----------------------------------------------------------------------------------------------- reset
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if self._kernel is not None:
            mask = torch.ones(self.batch_size, dtype=torch.bool) if mask is None else mask.reshape(-1).contiguous()
            self._kernel.reset(*self._state(), mask, self.layout_cells, self.layout_heading, self.layout_board)
            return self._reset_output()
        mask = torch.ones(self.batch_size, dtype=torch.bool, device=self.device) if mask is None else mask.view(-1)
        # Every legal start is precomputed (see _start_layouts): a reset copies one, drawn uniformly, per board.
        # Drawn for every board and kept where the mask holds: fixed shapes, no host sync on a GPU.
        layout = self._random(1)[:, 0] % self.layout_cells.shape[0]
        self.draws.add_(mask)
        column = mask.unsqueeze(1)
        self.board.copy_(torch.where(column, self.layout_board[layout], self.board))
        self.trail[:, :3] = torch.where(column, self.layout_cells[layout], self.trail[:, :3])
        head = self.layout_cells[layout, 2]
        for buffer, value in (
            (self.heading, self.layout_heading[layout]),
            (self.head_row, head // self.size),
            (self.head_col, head % self.size),
            (self.tail_slot, 0),
            (self.length, 3),
            (self.steps, 0),
        ):
            buffer.copy_(torch.where(mask, value, buffer))
        self._place_food(mask)
        return self._reset_output()

    def _reset_output(self) -> TensorDictBase:
        false = torch.zeros(*self.batch_size, 1, dtype=torch.bool, device=self.device)
        return TensorDict(
            {
                "observation": self._observation(),
                "food": torch.zeros(*self.batch_size, 1, device=self.device),
                "done": false,
                "terminated": false.clone(),
                "truncated": false.clone(),
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    # ------------------------------------------------------------------------------------------------ step
    def _state(self) -> tuple:
        return (
            self.board,
            self.trail,
            self.tail_slot,
            self.length,
            self.heading,
            self.head_row,
            self.head_col,
            self.food,
            self.steps,
            self.stream,
            self.draws,
            self.size,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict["action"].view(-1)
        if self._kernel is not None:
            ate, dead, full = (torch.empty(self.batch_size, dtype=torch.bool) for _ in range(3))
            self._kernel.step(*self._state(), action.contiguous(), ate, dead, full)
        else:
            ate, dead, full = self._advance(action)
            self.food.masked_fill_(full, -1)
            self._place_food(ate & ~full)
        terminated = (dead | full).unsqueeze(1)
        truncated = (self.steps >= self.max_steps).unsqueeze(1) & ~terminated
        return TensorDict(
            {
                "observation": self._observation(),
                "food": ate.float().unsqueeze(1),
                "reward": (ate.float() - dead.float()).unsqueeze(1),
                "done": terminated | truncated,
                "terminated": terminated,
                "truncated": truncated,
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Move every snake one cell; returns the boards that ate, died, and are now full.

        Branch-free and fixed-shape: no host sync, whatever the device.
        """
        reverse = (action ^ self.heading) == 2  # 0↔2 and 1↔3 are opposite
        heading = torch.where(reverse, self.heading, action)
        row, col = self.head_row + self.drow[heading], self.head_col + self.dcol[heading]
        inside_row, inside_col = row.clamp(0, self.size - 1), col.clamp(0, self.size - 1)
        wall = (inside_row != row) | (inside_col != col)
        new_head = inside_row * self.size + inside_col
        ate = (new_head == self.food) & ~wall
        tail = self.trail.view(-1)[self.trail_base + self.tail_slot]
        occupied = self.board.view(-1)[self.board_base + new_head] == 1
        # The tail leaves its cell this step unless the snake eats, so following the tail is safe.
        dead = wall | (occupied & ((new_head != tail) | ate))
        alive = ~dead
        leaves = alive & ~ate
        self._set(0, tail, 0, leaves)  # before the head enters: it may enter this very cell
        self._set(1, self.head_row * self.size + self.head_col, 0, alive)
        self._set(0, new_head, 1, alive)
        self._set(1, new_head, 1, alive)
        self._set(2, self.food, 0, ate)
        head_slot = self.tail_slot + self.length
        head_slot = torch.where(head_slot >= self.cells, head_slot - self.cells, head_slot)
        self.trail.view(-1)[self.trail_base + torch.where(alive, head_slot, self.cells)] = new_head
        tail_slot = self.tail_slot + leaves
        self.tail_slot.copy_(torch.where(tail_slot >= self.cells, tail_slot - self.cells, tail_slot))
        self.length.add_(ate)
        self.heading.copy_(heading)
        self.head_row.copy_(torch.where(alive, inside_row, self.head_row))
        self.head_col.copy_(torch.where(alive, inside_col, self.head_col))
        self.steps.add_(1)
        return ate, dead, self.length == self.cells
