"""Snake's step and reset as one C++ loop over the boards: the CPU fast path of :class:`SnakeEnv`.

The torch implementation in ``env.py`` is the reference (and the only path on CUDA); this kernel follows it rule
for rule and draw for draw — the same ring buffer, the same counter-based hash, the same candidate order — so both
produce identical games (``tests/envs/test_snake_env.py`` checks it). On 4,096 boards the torch path spends its time
dispatching ~45 small ops per step; here a step is one pass over the boards, split across torch's threads.

The extension is compiled on first use with ``torch.utils.cpp_extension.load_inline`` (ninja and a C++ compiler;
slow once, then cached under ``~/.cache/torch_extensions``).
"""

from __future__ import annotations

import functools
import warnings
from types import ModuleType

_SOURCE = r"""
// Only the headers the kernel uses: torch/extension.h (load_inline's default) triples the build's time.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <algorithm>
#include <cstring>

namespace {
constexpr uint64_t MASK = 0xFFFFFFFFull;
constexpr int64_t CANDIDATES = 16;
constexpr int64_t DROW[4] = {-1, 0, 1, 0};
constexpr int64_t DCOL[4] = {0, 1, 0, -1};

inline uint64_t hash32(uint64_t x) {
  x ^= x >> 16; x = (x * 0x7FEB352Dull) & MASK;
  x ^= x >> 15; x = (x * 0x846CA68Bull) & MASK;
  return x ^ (x >> 16);
}
inline uint64_t draw(uint64_t key, int64_t slot) {
  return hash32(key ^ ((static_cast<uint64_t>(slot) * 0x85EBCA77ull) & MASK));
}
inline uint64_t stream_key(int64_t stream, int64_t draws) {
  return hash32((static_cast<uint64_t>(stream) * 0x9E3779B1ull + static_cast<uint64_t>(draws)) & MASK);
}

struct Boards {
  uint8_t* board; int64_t* trail; int64_t* tail_slot; int64_t* length; int64_t* heading;
  int64_t* head_row; int64_t* head_col; int64_t* food; int64_t* steps; int64_t* stream; int64_t* draws;
  int64_t size, cells, row_bytes, trail_len;
};

// Food on a uniformly drawn empty cell: the first free of 16 candidates, else an exhaustive draw (as snake.py).
void place_food(const Boards& s, int64_t b) {
  uint8_t* row = s.board + b * s.row_bytes;
  const uint64_t key = stream_key(s.stream[b], s.draws[b]);
  int64_t choice = -1;
  for (int64_t k = 0; k < CANDIDATES && choice < 0; ++k) {
    const int64_t cell = static_cast<int64_t>(draw(key, k) % static_cast<uint64_t>(s.cells));
    if (row[cell] == 0) choice = cell;
  }
  if (choice < 0) {
    int64_t best = -1;
    for (int64_t cell = 0; cell < s.cells; ++cell) {
      const int64_t value = row[cell] == 0 ? static_cast<int64_t>(draw(key, CANDIDATES + cell)) : -1;
      if (value > best) { best = value; choice = cell; }
    }
    if (best < 0) choice = -1;
  }
  s.food[b] = choice;
  if (choice >= 0) row[2 * s.cells + choice] = 1;
  s.draws[b] += 1;
}

Boards view(at::Tensor board, at::Tensor trail, at::Tensor tail_slot, at::Tensor length,
            at::Tensor heading, at::Tensor head_row, at::Tensor head_col, at::Tensor food,
            at::Tensor steps, at::Tensor stream, at::Tensor draws, int64_t size) {
  return Boards{board.data_ptr<uint8_t>(), trail.data_ptr<int64_t>(), tail_slot.data_ptr<int64_t>(),
                length.data_ptr<int64_t>(), heading.data_ptr<int64_t>(), head_row.data_ptr<int64_t>(),
                head_col.data_ptr<int64_t>(), food.data_ptr<int64_t>(), steps.data_ptr<int64_t>(),
                stream.data_ptr<int64_t>(), draws.data_ptr<int64_t>(), size, size * size, board.size(1),
                trail.size(1)};
}
}  // namespace

// Moves every snake; fills ate, dead, full (bool [N]).
void step(at::Tensor board, at::Tensor trail, at::Tensor tail_slot, at::Tensor length,
          at::Tensor heading, at::Tensor head_row, at::Tensor head_col, at::Tensor food,
          at::Tensor steps, at::Tensor stream, at::Tensor draws, int64_t size, at::Tensor action,
          at::Tensor ate_out, at::Tensor dead_out, at::Tensor full_out) {
  const Boards s = view(board, trail, tail_slot, length, heading, head_row, head_col, food, steps, stream, draws, size);
  const int64_t* act = action.data_ptr<int64_t>();
  bool* ate_p = ate_out.data_ptr<bool>();
  bool* dead_p = dead_out.data_ptr<bool>();
  bool* full_p = full_out.data_ptr<bool>();
  at::parallel_for(0, board.size(0), 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      uint8_t* row = s.board + b * s.row_bytes;
      int64_t* ring = s.trail + b * s.trail_len;
      int64_t h = s.heading[b];
      if ((act[b] ^ h) != 2) h = act[b];  // reversing keeps going straight
      s.heading[b] = h;
      const int64_t r = s.head_row[b] + DROW[h], c = s.head_col[b] + DCOL[h];
      const bool wall = r < 0 || r >= s.size || c < 0 || c >= s.size;
      const int64_t rc = std::min(std::max(r, int64_t(0)), s.size - 1);
      const int64_t cc = std::min(std::max(c, int64_t(0)), s.size - 1);
      const int64_t head = rc * s.size + cc;
      const bool ate = head == s.food[b] && !wall;
      const int64_t tail = ring[s.tail_slot[b]];
      const bool dead = wall || (row[head] == 1 && (head != tail || ate));
      const bool alive = !dead, leaves = alive && !ate;
      if (leaves) row[tail] = 0;
      if (alive) {
        row[s.cells + s.head_row[b] * s.size + s.head_col[b]] = 0;
        row[head] = 1;
        row[s.cells + head] = 1;
      }
      if (ate) row[2 * s.cells + s.food[b]] = 0;
      int64_t head_slot = s.tail_slot[b] + s.length[b];
      if (head_slot >= s.cells) head_slot -= s.cells;
      if (alive) ring[head_slot] = head;
      int64_t tail_slot = s.tail_slot[b] + (leaves ? 1 : 0);
      s.tail_slot[b] = tail_slot >= s.cells ? tail_slot - s.cells : tail_slot;
      s.length[b] += ate ? 1 : 0;
      if (alive) { s.head_row[b] = rc; s.head_col[b] = cc; }
      s.steps[b] += 1;
      const bool full = s.length[b] == s.cells;
      if (full) s.food[b] = -1;
      if (ate && !full) place_food(s, b);
      ate_p[b] = ate; dead_p[b] = dead; full_p[b] = full;
    }
  });
}

// Re-initialises the boards where mask holds, from a uniformly drawn start layout.
void reset(at::Tensor board, at::Tensor trail, at::Tensor tail_slot, at::Tensor length,
           at::Tensor heading, at::Tensor head_row, at::Tensor head_col, at::Tensor food,
           at::Tensor steps, at::Tensor stream, at::Tensor draws, int64_t size, at::Tensor mask,
           at::Tensor layout_cells, at::Tensor layout_heading, at::Tensor layout_board) {
  const Boards s = view(board, trail, tail_slot, length, heading, head_row, head_col, food, steps, stream, draws, size);
  const bool* m = mask.data_ptr<bool>();
  const int64_t* cells = layout_cells.data_ptr<int64_t>();
  const int64_t* headings = layout_heading.data_ptr<int64_t>();
  const uint8_t* rows = layout_board.data_ptr<uint8_t>();
  const uint64_t layouts = static_cast<uint64_t>(layout_cells.size(0));
  at::parallel_for(0, board.size(0), 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      if (!m[b]) continue;
      const int64_t k = static_cast<int64_t>(draw(stream_key(s.stream[b], s.draws[b]), 0) % layouts);
      s.draws[b] += 1;
      std::memcpy(s.board + b * s.row_bytes, rows + k * s.row_bytes, s.row_bytes);
      int64_t* ring = s.trail + b * s.trail_len;
      for (int j = 0; j < 3; ++j) ring[j] = cells[k * 3 + j];
      s.heading[b] = headings[k];
      s.head_row[b] = cells[k * 3 + 2] / s.size;
      s.head_col[b] = cells[k * 3 + 2] % s.size;
      s.tail_slot[b] = 0; s.length[b] = 3; s.steps[b] = 0;
      place_food(s, b);
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("step", &step);
  m.def("reset", &reset);
}
"""


@functools.cache
def load() -> ModuleType | None:
    """The compiled kernel, or None (with a warning) where it cannot be built: the torch path then runs."""
    try:
        from torch.utils.cpp_extension import load_inline

        return load_inline(
            name="lightrl_snake_cpu",
            cpp_sources=_SOURCE,
            extra_cflags=["-O3"],
            no_implicit_headers=True,
            verbose=False,
        )
    except Exception as error:  # a missing compiler or ninja must not stop training: fall back to torch ops
        warnings.warn(f"SnakeEnv: the C++ kernel could not be built ({error}); using torch ops", stacklevel=2)
        return None
