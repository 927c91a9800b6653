"""Counter-based random numbers for batched environments: one independent stream per environment.

Environment ``i`` of a batch seeded with ``seed`` draws from a hash of ``(seed + i, its draw counter, slot)``, so

- a batch of N environments replays exactly the episodes of N single environments seeded ``seed … seed + N − 1``;
- the whole random state is two integer buffers (``stream``, ``draws``) that ``state_dict`` saves with the rest;
- nothing is shared between environments, so no host sync and no generator object is needed on a GPU.

Engines that take one integer seed per episode (MettaGrid, Gymnasium) get it from :func:`episode_seed` ``(seed + i, k)``
instead: the same rule per episode rather than per draw.
"""

from __future__ import annotations

import math

import numpy as np
import torch

MASK32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' ``lowbias32`` integer hash on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32  # the product may wrap int64; its low 32 bits are still right
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def random_bits(stream: torch.Tensor, draws: torch.Tensor, slots: int, first_slot: int = 0) -> torch.Tensor:
    """32-bit random values ``[num_envs, slots]`` from each environment's stream at its current draw count."""
    key = hash32((stream * 0x9E3779B1 + draws) & MASK32)
    if torch.compiler.is_compiling():
        # The slots' keys as a constant table: compiled for a GPU by torch 2.11's Inductor, an arange's arithmetic
        # becomes int32 index arithmetic, where Triton rejects these 32-bit constants (the H200, 2026-11-30).
        slot_keys = [(slot * 0x85EBCA77) & MASK32 for slot in range(first_slot, first_slot + slots)]
        return hash32(key.unsqueeze(1) ^ torch.tensor(slot_keys, device=stream.device))
    # Eagerly on the device: a table would be a host-to-device copy, a synchronisation, every step.
    slot = torch.arange(first_slot, first_slot + slots, device=stream.device)
    return hash32(key.unsqueeze(1) ^ ((slot * 0x85EBCA77) & MASK32))


def uniform(bits: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniform floats in the open interval (0, 1) from 32-bit values (open, so that ``log`` is always finite)."""
    return ((bits >> 8).to(dtype) + 0.5) * (1.0 / (1 << 24))


def normal(stream: torch.Tensor, draws: torch.Tensor, count: int, first_slot: int = 0) -> torch.Tensor:
    """Standard normal samples ``[num_envs, count]`` (Box–Muller on pairs of uniforms)."""
    pairs = (count + 1) // 2
    u = uniform(random_bits(stream, draws, 2 * pairs, first_slot))
    radius = torch.sqrt(-2.0 * torch.log(u[:, :pairs]))
    angle = (2.0 * math.pi) * u[:, pairs:]
    return torch.cat((radius * torch.cos(angle), radius * torch.sin(angle)), dim=1)[:, :count]


def episode_seed(stream: int, episode: int) -> int:
    """The seed (31 bits) of episode ``episode`` of the environment seeded ``stream`` (engines seeded per episode)."""
    return int(np.random.SeedSequence([stream % 2**64, episode]).generate_state(1)[0]) & 0x7FFFFFFF
