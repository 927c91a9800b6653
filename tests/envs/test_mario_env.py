"""Super Mario Bros on the real NES emulator: the NumPy-2 layer on its own, then the environment's rules.

Facts of stage 1-1 used below (the game is deterministic): Mario starts at x = 40; holding right without jumping he
walks into the first Goomba and dies on the 27th step (x = 296); standing still he is stuck after 40 steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchrl.envs.utils import check_env_specs

from app.cli import main
from envs.mario.env import ACTION_NAMES, MarioEnv
from envs.mario.nes_compat import IntReadRAM, MarioEmulator

RIGHT, LEFT, NOOP = ACTION_NAMES.index("right"), ACTION_NAMES.index("left"), ACTION_NAMES.index("NOOP")


def play(env: MarioEnv, actions: list[list[int]]) -> list:
    """Step ``env`` through ``actions`` (one list per step, an action per environment) from where it stands (reset
    first if it never was), resetting finished environments as a collector does; returns each step's output."""
    td = env.reset() if env._episode.min() < 0 else env._output()
    outputs = []
    for step_actions in actions:
        td["action"] = torch.tensor(step_actions)
        out, td = env.step_and_maybe_reset(td)
        outputs.append(out.clone())
    return outputs


# ------------------------------------------------------------------------------------------ NumPy-2 layer
def test_the_rom_loads_and_ram_reads_promote_like_numpy_1_while_writes_reach_the_emulator():
    emulator = MarioEmulator(1, 1)
    ram = emulator.ram
    assert isinstance(ram, IntReadRAM) and ram.dtype == np.uint8 and ram.shape == (0x800,)
    assert type(ram[0x6D]) is int  # a uint8 scalar would overflow in ram[0x6d] * 0x100
    # A page beyond 255 pixels: the x position needs Python-int arithmetic (NumPy 2 raises OverflowError on uint8).
    ram[0x6D], ram[0x86] = 3, 200
    assert emulator.x_position == 3 * 256 + 200
    # Still a view of the emulator's memory: a fresh view of the same C++ buffer sees the write.
    assert emulator._ram_buffer()[0x86] == 200
    emulator.close()


# ------------------------------------------------------------------------------------------ environment
def test_specs_shapes_and_the_first_observation():
    env = MarioEnv(num_envs=2, noop_max=0)
    check_env_specs(env)
    td = env.reset()
    assert td["observation"].shape == (2, 8, 128, 128) and td["observation"].dtype == torch.uint8
    assert env.action_spec.space.n == 12
    # The stage's first frame, stacked 8 times, identical in both emulators.
    first = td["observation"][0, -1]
    assert first.float().std() > 10  # a real picture, not a blank screen
    assert torch.equal(td["observation"], first.expand(2, 8, 128, 128))
    env.close()


def test_an_observation_is_the_luma_of_the_games_own_rgb_screen_area_resized():
    # The environment reads the emulator's raw 32-bit pixels (contiguous, fast); here the reference is the game's
    # own RGB view of them, in float64: ITU-R 601 luma, area-resized to 128 x 128, rounded.
    env = MarioEnv(num_envs=1, noop_max=0)
    last = play(env, [[RIGHT]] * 20)[-1]["next", "observation"][0, -1]
    rgb = torch.from_numpy(env._emulators[0].screen.astype(np.float64))
    luma = rgb @ torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    expected = F.interpolate(luma[None, None], size=(128, 128), mode="area")[0, 0].round()
    difference = (last.double() - expected).abs()
    assert difference.max() <= 1 and (difference > 0).double().mean() < 0.01  # float32 rounding at .5 at most
    assert last.double().std() > 10
    env.close()


def test_rewards_stack_and_death_follow_the_seeds_rules():
    env = MarioEnv(num_envs=1, noop_max=0)
    env.reset()
    emulator = env._emulators[0]
    positions, outputs = [emulator.x_position], []
    for _ in range(27):
        out = play(env, [[RIGHT]])[0]
        outputs.append(out)
        positions.append(int(out["next", "x_pos"]) if out["next", "done"] else emulator.x_position)
    moved = np.diff(positions)
    rewards = [float(out["next", "reward"]) for out in outputs]
    # +1/6 per pixel right on every step; the 27th step (the Goomba) adds -1 and ends the episode as terminated.
    assert moved[:26].min() > 0
    assert rewards[:26] == pytest.approx((moved[:26] / 6).tolist(), abs=1e-6)
    last = outputs[-1]["next"]
    assert rewards[-1] == pytest.approx(moved[-1] / 6 - 1, abs=1e-6)
    assert bool(last["terminated"]) and bool(last["done"]) and not bool(last["truncated"])
    assert float(last["x_pos"]) == 296 and float(last["flag_get"]) == 0
    assert all(not bool(out["next", "done"]) for out in outputs[:-1])
    # Each observation is the previous one shifted by a frame, the newest last.
    for before, after in zip(outputs, outputs[1:], strict=False):
        assert torch.equal(after["observation"], before["next", "observation"])
        assert torch.equal(after["next", "observation"][:, :-1], before["next", "observation"][:, 1:])
    env.close()


def test_moving_left_costs_half_and_standing_still_ends_stuck_after_40_steps():
    env = MarioEnv(num_envs=1, noop_max=0)
    env.reset()
    emulator = env._emulators[0]
    play(env, [[RIGHT]] * 10)
    moves = []
    for _ in range(8):  # he slides on for a step or two before turning
        x = emulator.x_position
        reward = float(play(env, [[LEFT]])[0]["next", "reward"])
        moves.append((emulator.x_position - x, reward))
    assert min(moved for moved, _ in moves) < 0
    for moved, reward in moves:
        assert reward == pytest.approx(moved / 6 if moved > 0 else moved / 12, abs=1e-6)
    # Standing still from the start, he never passes x = 40: -0.5 and the end on the 40th step.
    env.reset()
    outputs = play(env, [[NOOP]] * 40)
    assert all(not bool(o["next", "done"]) for o in outputs[:-1])
    end = outputs[-1]["next"]
    assert bool(end["terminated"]) and float(end["reward"]) == pytest.approx(-0.5)
    assert float(end["x_pos"]) == 40
    env.close()


@pytest.mark.slow
def test_a_batch_plays_the_games_of_single_environments_and_noop_starts_differ():
    actions = torch.randint(0, 12, (60, 2), generator=torch.Generator().manual_seed(0)).tolist()
    batch = play(MarioEnv(num_envs=2, seed=5, noop_max=8), actions)
    for env_index in range(2):
        single = play(MarioEnv(num_envs=1, seed=5 + env_index, noop_max=8), [[a[env_index]] for a in actions])
        for b, s in zip(batch, single, strict=True):
            assert torch.equal(b["next", "observation"][env_index], s["next", "observation"][0])
            assert torch.equal(b["next", "reward"][env_index], s["next", "reward"][0])
            assert torch.equal(b["next", "done"][env_index], s["next", "done"][0])
    # Different seeds start their episodes after different numbers of no-op steps: different first frames.
    starts = [MarioEnv(num_envs=1, seed=seed, noop_max=8).reset()["observation"][0, -1] for seed in range(4)]
    assert len({frame.sum().item() for frame in starts}) > 1


@pytest.mark.slow
def test_the_state_restores_running_episodes_exactly():
    actions = torch.randint(0, 6, (50, 2), generator=torch.Generator().manual_seed(1)).tolist()
    env = MarioEnv(num_envs=2, seed=3)
    play(env, actions[:30])
    state = env.state_dict()
    expected = play(env, actions[30:])
    restored = MarioEnv(num_envs=2, seed=99)
    restored.load_state_dict(state)
    td = restored._output()  # what the collector's carried observation would be after the restore
    assert torch.equal(td["observation"], expected[0]["observation"])
    resumed = []
    for step_actions in actions[30:]:
        td["action"] = torch.tensor(step_actions)
        out, td = restored.step_and_maybe_reset(td)
        resumed.append(out)
    for a, b in zip(expected, resumed, strict=True):
        assert torch.equal(a["next", "observation"], b["next", "observation"])
        assert torch.equal(a["next", "reward"], b["next", "reward"])
    with pytest.raises(ValueError, match="other options"):
        MarioEnv(num_envs=2, stuck_steps=10).load_state_dict(state)


@pytest.mark.slow
def test_an_unknown_stage_is_one_error_line_naming_the_flag(tmp_path, capsys):
    flag = "--data.init_args.env.init_args.stage"
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", "configs/mario_ddqn.yaml", flag, "9-9", "--trainer.default_root_dir", str(tmp_path)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {flag} must be 'W-S' with world 1-8 and stage 1-4 (e.g. '1-1'), got '9-9'"
    ]
