"""Super Mario Bros on the real NES emulator as a batched TorchRL environment, with the reference's processing
(docs/reference_systems.md §3).

**Batch.** ``[num_envs]`` emulators in this process, stepped one after the other (each is a C++ emulator that holds
the GIL: parallelism comes from collector worker processes, each with its own emulators). Keys: ``observation``
uint8 ``[num_envs, frame_stack, size, size]`` (the last ``frame_stack`` grayscale frames, oldest first),
``action`` int64 (the 12 ``COMPLEX_MOVEMENT`` button combinations, :data:`ACTION_NAMES`), ``reward`` float32 and
``done``/``terminated``/``truncated`` bool ``[num_envs, 1]``.

**A step** holds the action's buttons for ``frame_skip`` emulator frames (fewer if the episode ends within them)
and shows the last frame, grayscaled (ITU-R 601 weights) and area-resized from 240×256 to ``size``×``size``.

**Reward** (the reference's): ``+1/6`` per pixel Mario moved right during the step, half that as a penalty per pixel
left; ``−1`` and the end when he dies (one life: falling, an enemy, the game's timer); ``+2`` and the end at the
flag; ``−0.5`` and the end when he has not passed his rightmost position for ``stuck_steps`` steps. All three
endings are ``terminated`` (the reference ended the episode there; nothing is truncated).

**Episode metrics** (``episode_metric_keys``, reported by evaluation): ``x_pos``, the rightmost x position reached
(pixels from the level's start; Mario starts at 40), and ``flag_get``, 1 when the flag was reached — both written
on an episode's last step and 0 on the others, so an episode's sum is its value.

**Starts.** The game is deterministic: every episode restores the same frame, the stage's first. So that episodes
differ where nothing else makes them (a greedy evaluation), each can begin with ``0 … noop_max`` steps of no buttons,
a number drawn from episode ``k`` of environment ``i``'s own seed ``(seed + i, k)``: a batch plays what single
environments seeded ``seed + i`` play. The shipped config evaluates with ``noop_max`` 8 and trains with 0: ε-greedy
makes training episodes differ, and no-op steps are emulator frames that are not experiences.

**State.** An emulator's state cannot be read out, so ``state_dict`` holds each running episode's number and the
actions taken since its start; loading restores the start frame and replays them, at the emulator's own speed.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from checkpoints.files import CheckpointMismatch
from envs.base import BatchedEnv
from envs.mario.nes_compat import ACTION_BUTTONS, ACTION_NAMES, MarioEmulator

__all__ = ["ACTION_NAMES", "MarioEnv"]

SCREEN_SHAPE = (240, 256)
_PIXEL_LUMA = torch.tensor(MarioEmulator.PIXEL_LUMA)
_STAGE = re.compile(r"^([1-8])-([1-4])$")
# An agent step moves Mario at most a few pixels a frame; a larger jump is the game moving him (a pipe into another
# area, the restart after death), not progress, and earns nothing (nes-py's own rule, per frame).
_MAX_PIXELS_PER_FRAME = 5
_LOG_CHUNK = 1024  # actions recorded per environment before the log grows


def parse_stage(stage: str) -> tuple[int, int]:
    """``"W-S"`` → ``(W, S)``: worlds 1–8, stages 1–4 (the original game's 32 levels)."""
    found = _STAGE.match(str(stage))
    if not found:
        raise ValueError(f"stage must be 'W-S' with world 1-8 and stage 1-4 (e.g. '1-1'), got {stage!r}")
    return int(found.group(1)), int(found.group(2))


class MarioEnv(BatchedEnv):
    """``num_envs`` Super Mario Bros emulators playing one stage, with the reference's frames, actions and reward.

    Args:
        num_envs: emulators stepped together.
        stage: the level, ``"W-S"`` (``"1-1"``: world 1, stage 1).
        frame_skip: emulator frames per step, the action held throughout.
        frame_stack: frames in an observation, the newest last.
        size: observed frames are ``size``×``size`` pixels.
        stuck_steps: steps without a new rightmost position that end the episode.
        noop_max: the most no-button steps an episode starts with (drawn per episode; 0: none).
        seed: base seed; environment ``i`` draws its starts from stream ``seed + i``.
        device: where the returned tensors live (the emulators run on the CPU).
    """

    episode_metric_keys = ("x_pos", "flag_get")
    can_render = True
    # The step holds the action for `frame_skip` frames itself; without this TorchRL's EnvBase wraps any env with a
    # `frame_skip` attribute in a FrameSkipTransform, which would repeat whole steps `frame_skip` times.
    _has_frame_skip = True

    def __init__(
        self,
        num_envs: int = 1,
        stage: str = "1-1",
        frame_skip: int = 6,
        frame_stack: int = 8,
        size: int = 128,
        stuck_steps: int = 40,
        noop_max: int = 8,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        # Messages start with the argument's name: the command line prefixes the flag path it was given under.
        for name, value in (
            ("num_envs", num_envs),
            ("frame_skip", frame_skip),
            ("frame_stack", frame_stack),
            ("size", size),
            ("stuck_steps", stuck_steps),
        ):
            if value < 1:
                raise ValueError(f"{name} must be > 0, got {value}")
        if noop_max < 0:
            raise ValueError(f"noop_max must be >= 0, got {noop_max}")
        self.world, self.stage_number = parse_stage(stage)
        super().__init__(batch_size=torch.Size([num_envs]), device=device)
        self.stage, self.frame_skip, self.frame_stack, self.size = stage, frame_skip, frame_stack, size
        self.stuck_steps, self.noop_max = stuck_steps, noop_max
        self._emulators = [MarioEmulator(self.world, self.stage_number) for _ in range(num_envs)]
        self._frames = torch.zeros(num_envs, frame_stack, size, size, dtype=torch.uint8)
        n = num_envs
        self._stream = torch.arange(n, dtype=torch.long) + seed
        self._next_episode = torch.zeros(n, dtype=torch.long)
        self._episode = torch.full((n,), -1, dtype=torch.long)  # the running episode's number; -1: none yet
        self._steps = torch.zeros(n, dtype=torch.long)  # agent steps since the episode's start (no-ops excluded)
        self._log = torch.zeros(n, _LOG_CHUNK, dtype=torch.uint8)  # those steps' actions
        self._rightmost = [0] * n
        self._since_progress = [0] * n

        dev, batch = self.device, (n,)
        self.observation_spec = Composite(
            observation=Bounded(0, 255, shape=(*batch, frame_stack, size, size), dtype=torch.uint8, device=dev),
            **{key: Unbounded(shape=(*batch, 1), device=dev) for key in self.episode_metric_keys},
            shape=batch,
            device=dev,
        )
        self.action_spec = Categorical(len(ACTION_BUTTONS), shape=batch, device=dev)
        self.reward_spec = Unbounded(shape=(*batch, 1), device=dev)

    # ------------------------------------------------------------------------------------------- frames
    def _screens(self, envs: list[int]) -> torch.Tensor:
        """The emulators' current frames, grayscale ``[len(envs), size, size]`` uint8."""
        pixels = torch.from_numpy(np.stack([self._emulators[env].screen_pixels for env in envs])).float()
        gray = (pixels @ _PIXEL_LUMA).unsqueeze(1)
        small = F.interpolate(gray, size=(self.size, self.size), mode="area")
        return small.squeeze(1).round_().to(torch.uint8)

    def render(self, index: int = 0) -> np.ndarray:
        """Emulator ``index``'s screen as it is now: RGB ``[240, 256, 3]``, the frame the last observation was made
        from (before grayscale and resizing)."""
        return np.ascontiguousarray(self._emulators[self._render_index(index)].screen)

    # ------------------------------------------------------------------------------------------- episodes
    def _start(self, env: int, episode: int) -> None:
        """Restore the stage's first frame and play episode ``episode``'s no-op start."""
        emulator = self._emulators[env]
        emulator.reset()
        noops = 0
        if self.noop_max:
            noops = int(np.random.default_rng([int(self._stream[env]), episode]).integers(0, self.noop_max + 1))
        for _ in range(noops * self.frame_skip):
            emulator.advance(0)
        self._episode[env], self._steps[env] = episode, 0
        self._rightmost[env], self._since_progress[env] = emulator.x_position, 0

    def _restart(self, envs: list[int]) -> None:
        for env in envs:
            self._start(env, int(self._next_episode[env]))
            self._next_episode[env] += 1
        if envs:
            self._frames[envs] = self._screens(envs).unsqueeze(1).expand(-1, self.frame_stack, -1, -1)

    def _output(self, reward: torch.Tensor | None = None, ended: torch.Tensor | None = None, **metrics: Any) -> Any:
        n = self.batch_size[0]
        terminated = torch.zeros(n, 1, dtype=torch.bool) if ended is None else ended.unsqueeze(1)
        out = {"observation": self._frames.clone(), "terminated": terminated, "truncated": torch.zeros_like(terminated)}
        out["done"] = terminated.clone()
        for key in self.episode_metric_keys:
            out[key] = metrics.get(key, torch.zeros(n)).view(n, 1).float()
        if reward is not None:
            out["reward"] = reward.view(n, 1)
        return TensorDict(out, batch_size=self.batch_size, device=self.device)  # moves the entries when not on CPU

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Restart the flagged environments (all, without ``_reset``) and those never started."""
        flags = None if tensordict is None else tensordict.get("_reset", None)
        restart = torch.ones(self.batch_size, dtype=torch.bool) if flags is None else flags.view(-1).cpu()
        self._restart((restart | (self._episode < 0)).nonzero().flatten().tolist())
        return self._output()

    def maybe_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Restart the finished environments; every entry but the step's metrics is replaced by ``_reset``'s
        (current for the others), which spares TorchRL's per-key masked merge."""
        done = tensordict.get("done").view(-1).cpu()
        if bool(done.any()):
            self._restart(done.nonzero().flatten().tolist())
            tensordict.update(self._output().exclude(*self.episode_metric_keys))
        return tensordict

    def _play(self, env: int, action: int) -> tuple[float, bool, bool]:
        """Environment ``env``'s step with action ``action``: the reward, whether the episode ended, and whether it
        ended at the flag. Also what a restored checkpoint replays."""
        emulator = self._emulators[env]
        start = emulator.x_position
        ended = False
        for _ in range(self.frame_skip):
            if emulator.advance(ACTION_BUTTONS[action]):
                ended = True
                break
        moved = emulator.x_position - start
        if abs(moved) > _MAX_PIXELS_PER_FRAME * self.frame_skip:
            moved = 0
        reward = moved / 6 if moved > 0 else moved / 12
        flag = ended and emulator.flag_reached
        if ended:
            reward += 2.0 if flag else -1.0
        if emulator.x_position > self._rightmost[env]:
            self._rightmost[env], self._since_progress[env] = emulator.x_position, 0
        else:
            self._since_progress[env] += 1
            if not ended and self._since_progress[env] >= self.stuck_steps:
                reward, ended = reward - 0.5, True
        step = int(self._steps[env])
        if step == self._log.shape[1]:
            self._log = torch.cat((self._log, torch.zeros_like(self._log[:, :_LOG_CHUNK])), 1)
        self._log[env, step] = action
        self._steps[env] += 1
        return reward, ended, flag

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if bool((self._episode < 0).any()):
            raise RuntimeError("MarioEnv: reset the environment before stepping it")
        actions = tensordict.get("action").view(-1).tolist()
        n = len(actions)
        reward, ended, flag = torch.zeros(n), torch.zeros(n, dtype=torch.bool), torch.zeros(n)
        x_pos = torch.zeros(n)
        for env, action in enumerate(actions):
            reward[env], ended[env], flag[env] = self._play(env, action)
            if ended[env]:
                x_pos[env] = self._rightmost[env]
        self._frames[:, :-1] = self._frames[:, 1:].clone()
        self._frames[:, -1] = self._screens(list(range(n)))
        return self._output(reward, ended, x_pos=x_pos, flag_get=flag)

    def _set_seed(self, seed: int | None) -> None:
        """Environment ``i`` starts stream ``seed + i`` from its first episode at its next reset."""
        self._stream = torch.arange(self.batch_size[0], dtype=torch.long) + (0 if seed is None else seed)
        self._next_episode.zero_()

    def close(self, *, raise_if_closed: bool = True) -> None:
        for emulator in self._emulators:
            if emulator._env is not None:
                emulator.close()
        super().close(raise_if_closed=raise_if_closed)

    # ---------------------------------------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, Any]:
        """Plain tensors (``torch.load(weights_only=True)`` reads them): the seed streams, episode numbers, and the
        actions of the running episodes (uint8 ``[num_envs, longest]``)."""
        return {
            "stage": torch.tensor([self.world, self.stage_number, self.frame_skip, self.stuck_steps, self.noop_max]),
            "stream": self._stream.clone(),
            "next_episode": self._next_episode.clone(),
            "episode": self._episode.clone(),
            "steps": self._steps.clone(),
            "actions": self._log[:, : int(self._steps.max())].clone(),
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restart each running episode and replay its actions: the emulators, frames and counters continue exactly."""
        n = self.batch_size[0]
        if state["stream"].shape != (n,):
            raise CheckpointMismatch(
                f"its environment state is for {state['stream'].shape[0]} environments; this run's has {n}"
            )
        options = [self.world, self.stage_number, self.frame_skip, self.stuck_steps, self.noop_max]
        if state["stage"].tolist() != options:
            raise CheckpointMismatch(
                "its environment state is for other options (stage, frame_skip, stuck_steps or noop_max)"
            )
        self._stream, self._next_episode = state["stream"].clone(), state["next_episode"].clone()
        actions = state["actions"]
        for env in range(n):
            episode, steps = int(state["episode"][env]), int(state["steps"][env])
            if episode < 0:
                self._episode[env], self._steps[env] = -1, 0
                continue
            self._start(env, episode)
            frames = [self._screens([env])[0]]
            for action in actions[env, :steps].tolist():
                self._play(env, action)
                frames.append(self._screens([env])[0])
            history = frames[-self.frame_stack :]
            history = [history[0]] * (self.frame_stack - len(history)) + history
            self._frames[env] = torch.stack(history)
