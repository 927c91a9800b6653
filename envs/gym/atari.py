"""What Gymnasium's wrappers lack for the RL Zoo's Atari preprocessing (Stable-Baselines3's ``AtariWrapper``).

Gymnasium's ``AtariPreprocessing`` (no-op starts, frame skip with max-pooling, 84×84 grey), ``FrameStackObservation``
and ``ClipReward`` do the rest, named in a config's ``wrappers``; the life loss is ``GymnasiumEnv``'s
``episodic_life`` option (``envs/gym/env.py``: Gymnasium's ``terminal_on_life_loss`` restarts the game).
"""

from __future__ import annotations

from typing import Any

import gymnasium


class FireReset(gymnasium.Wrapper):
    """Press FIRE (then action 2) at the start of a game and after each lost life, in games whose play only starts on
    FIRE (Breakout): Stable-Baselines3's ``FireResetEnv`` under its ``EpisodicLifeEnv``, which fires at each life's
    "reset". Here a lost life is no reset (``GymnasiumEnv``'s ``episodic_life`` goes on playing), so the presses
    follow the step that lost it, their rewards added to its reward. Without them a policy that never chose FIRE
    (a greedy one, early in training) would stand still until the emulator's frame limit. In a game without a FIRE
    action it does nothing."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings() if hasattr(env.unwrapped, "get_action_meanings") else []
        self.fires = len(meanings) >= 3 and meanings[1] == "FIRE"
        self.lives = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        observation, info = self.env.reset(**kwargs)
        if self.fires:
            observation, _, terminated, truncated, info = self._fire()
            if terminated or truncated:  # as Stable-Baselines3: a game over on these steps starts again
                observation, info = self.env.reset(**kwargs)
        self.lives = self._lives()
        return observation, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        lives = self._lives()
        if self.fires and lives < self.lives and not (terminated or truncated):
            observation, fired, terminated, truncated, info = self._fire()
            reward += fired
        self.lives = lives
        return observation, reward, terminated, truncated, info

    def _fire(self) -> tuple[Any, float, bool, bool, dict]:
        total = 0.0
        for action in (1, 2):
            observation, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return observation, total, terminated, truncated, info

    def _lives(self) -> int:
        return int(self.env.unwrapped.ale.lives()) if self.fires else 0
