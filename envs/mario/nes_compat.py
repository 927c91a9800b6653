"""Super Mario Bros on the real NES emulator under NumPy 2: the small compatibility layer it needs.

``nes-py==8.2.1`` (the C++ emulator) and ``gym-super-mario-bros==7.4.0`` (the game's RAM map and rules) are the last
releases that install on Python 3.11, and both were written for NumPy 1, whose uint8 scalars silently promoted in
arithmetic. Under NumPy 2 they overflow instead:

- the ROM header's sizes are uint8, so ``prg_rom_size * 2**10`` raises ``OverflowError`` while loading the ROM;
- the game reads its RAM as uint8 scalars, so ``ram[0x6d] * 0x100`` (Mario's x position) overflows.

This module fixes both without touching either package's files: the ROM's size properties return Python ints, and
:class:`MarioEmulator` views its RAM as :class:`IntReadRAM`, an ndarray subclass whose single-byte reads are Python
ints. It is still a view of the emulator's memory, so the game's RAM writes (skipping the start screen, selecting
the stage) still reach the emulator. ``gym.make`` is not used: its environment checker calls the removed
``np.bool8``; :class:`MarioEmulator` is built directly.
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

import numpy as np

with contextlib.redirect_stderr(io.StringIO()):  # gym 0.26 prints a banner about NumPy 2 on import
    from gym_super_mario_bros.actions import COMPLEX_MOVEMENT
    from gym_super_mario_bros.smb_env import SuperMarioBrosEnv
    from nes_py import _rom
    from nes_py.wrappers.joypad_space import JoypadSpace


class IntReadRAM(np.ndarray):
    """A uint8 view of the emulator's RAM whose single-element reads are Python ints (they promote like NumPy 1's)."""

    def __getitem__(self, index: Any) -> Any:
        value = super().__getitem__(index)
        return int(value) if isinstance(value, np.integer) else value


def _int_header_size(byte: int, unit: int) -> property:
    return property(lambda rom: unit * int(rom.header[byte]))


# The header stores PRG-ROM in 16 KiB units (byte 4) and CHR-ROM in 8 KiB units (byte 5); nes-py multiplies them by
# 2**10 as uint8. Setting a class attribute twice is harmless, so importing this module again changes nothing.
_rom.ROM.prg_rom_size = _int_header_size(4, 16)
_rom.ROM.chr_rom_size = _int_header_size(5, 8)

#: The reference's 12 actions (gym-super-mario-bros' ``COMPLEX_MOVEMENT``) as joypad bytes, in that order.
ACTION_BUTTONS: tuple[int, ...] = tuple(
    sum(JoypadSpace._button_map[button] for button in buttons) for buttons in COMPLEX_MOVEMENT
)
ACTION_NAMES: tuple[str, ...] = tuple("+".join(buttons) for buttons in COMPLEX_MOVEMENT)


class MarioEmulator(SuperMarioBrosEnv):
    """``SuperMarioBrosEnv`` (one stage, one life) whose RAM reads work under NumPy 2.

    Construction runs the emulator past the title screen into the stage and keeps that state as the one every
    ``reset`` restores, so every episode starts from the same frame.

    Args:
        world: 1–8.
        stage: 1–4.
    """

    def __init__(self, world: int = 1, stage: int = 1) -> None:
        super().__init__(target=(world, stage))
        # nes-py's `screen` is a channel-reversed view of the emulator's 32-bit pixels, which copies byte by byte: a
        # large part of the frames' cost (docs/history/mario.md, "Again, after cheaper frames and bfloat16
        # acting"). Its base is those pixels as they are, contiguous.
        self.screen_pixels: np.ndarray = self.screen.base.reshape(*self.screen.shape[:2], 4)

    #: The luma weights (ITU-R 601) of :attr:`screen_pixels`' four bytes: B, G, R, padding on little-endian machines
    #: (nes-py reverses them into R, G, B there), padding, R, G, B on big-endian ones.
    PIXEL_LUMA = (0.114, 0.587, 0.299, 0.0) if sys.byteorder == "little" else (0.0, 0.299, 0.587, 0.114)

    def _ram_buffer(self) -> np.ndarray:
        return super()._ram_buffer().view(IntReadRAM)

    def advance(self, buttons: int) -> bool:
        """One emulator frame with ``buttons`` held: the game's own step without its per-frame reward and info
        dictionary (the environment reads what it needs once per agent step). Returns whether Mario died or reached
        the flag (the single-stage episode's end)."""
        self._frame_advance(buttons)
        done = bool(self._get_done())
        self._did_step(done)  # the game's skips: a dying Mario is killed at once, area changes and pauses run out
        return done

    @property
    def x_position(self) -> int:
        return self._x_position

    @property
    def flag_reached(self) -> bool:
        return bool(self._flag_get)

    @property
    def dead(self) -> bool:
        return bool(self._is_dying or self._is_dead)
