"""``BatchedEnv.render``: each environment's frame has the contract's shape and shows its state."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from envs.racing.env import CAR_FRONT, CAR_REAR, RacingEnv
from envs.snake.env import RENDER_CELL, RENDER_COLOURS, SnakeEnv
from envs.testing.chain import ChainEnv


def assert_frame(image: np.ndarray, shape: tuple[int, int]) -> None:
    assert image.dtype == np.uint8 and image.shape == (*shape, 3) and image.flags.c_contiguous


def test_an_environment_that_cannot_render_says_so():
    env = ChainEnv(num_envs=2)
    assert not env.can_render
    with pytest.raises(NotImplementedError, match=r"envs\.testing\.chain\.ChainEnv cannot render"):
        env.render(0)


def cell_colour(image: np.ndarray, row: int, col: int) -> tuple[int, ...]:
    centre = RENDER_CELL // 2
    return tuple(image[row * RENDER_CELL + centre, col * RENDER_CELL + centre])


def test_snake_frame_is_the_board():
    env = SnakeEnv(num_envs=2, size=8, backend="torch", seed=3)
    td = env.reset()
    assert env.can_render
    for _ in range(4):
        for index in range(2):
            image = env.render(index)
            assert_frame(image, (8 * RENDER_CELL, 8 * RENDER_CELL))
            body, head, food = (plane.numpy() for plane in td["observation"][index])
            for row in range(8):
                for col in range(8):
                    expected = 2 if head[row, col] else 1 if body[row, col] else 3 if food[row, col] else 0
                    assert cell_colour(image, row, col) == tuple(RENDER_COLOURS[expected]), (row, col)
            assert cell_colour(image, int(env.head_row[index]), int(env.head_col[index])) == tuple(RENDER_COLOURS[2])
        td = env.step(td.set("action", env.heading.clone()))["next"]  # straight on: the head moves a cell
    with pytest.raises(ValueError, match=r"index must be in \[0, 2\)"):
        env.render(2)


def car_pixels(image: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    rows, cols = np.nonzero(np.all(image == colour, axis=-1))
    return np.stack((cols + 0.5, rows + 0.5), 1)  # pixel centres as (column, row)


def test_racing_frame_shows_the_car_where_it_is_heading_where_it_heads():
    env = RacingEnv(num_envs=2, seed=1)
    td = env.reset()
    assert env.can_render
    first = env.render(1)
    assert first.shape[1] == 512 and first.shape[0] % 16 == 0
    positions = []
    for _ in range(3):
        image = env.render(1)
        assert_frame(image, first.shape[:2])
        rear, front = car_pixels(image, CAR_REAR), car_pixels(image, CAR_FRONT)
        assert len(rear) and len(front)
        centre = np.concatenate((rear, front)).mean(0)
        expected = np.array(env.pixel_of(float(env.x[1]), float(env.y[1])))
        assert np.abs(centre - expected).max() < 1.5  # the car's middle, to within a pixel's rasterization
        # Front minus rear, in image coordinates (rows grow downwards): the car's heading.
        direction = front.mean(0) - rear.mean(0)
        assert abs(math.remainder(math.atan2(-direction[1], direction[0]) - float(env.yaw[1]), 2 * math.pi)) < 0.35
        positions.append(centre)
        action = torch.tensor([[4.0, 0.0]]).expand(2, 2)  # full throttle, straight: a second of driving
        for _ in range(50):
            td = env.step(td.set("action", action))["next"]
    assert np.linalg.norm(positions[1] - positions[0]) > 5 and np.linalg.norm(positions[2] - positions[1]) > 5
    # The other car's frame is its own; the track is the same.
    other = env.render(0)
    assert not np.array_equal(other, env.render(1))


def test_mario_frame_is_the_screen_the_observation_is_made_from():
    pytest.importorskip("nes_py")
    from envs.mario.env import MarioEnv

    env = MarioEnv(num_envs=1, frame_stack=2, size=84)
    td = env.reset()
    assert env.can_render
    for _ in range(3):
        image = env.render(0)
        assert_frame(image, (240, 256))
        # The observation's newest frame: the screen grayscaled (ITU-R 601) and area-resized, as the env makes it.
        gray = torch.from_numpy(image).float() @ torch.tensor([0.299, 0.587, 0.114])
        small = F.interpolate(gray[None, None], size=(84, 84), mode="area")[0, 0].round()
        assert (small - td["observation"][0, -1].float()).abs().max() <= 1
        td = env.step(td.set("action", torch.tensor([3])))["next"]  # right + B: run
    env.close()


def test_mettagrid_frame_is_the_map():
    pytest.importorskip("mettagrid")
    from envs.mettagrid.env import AGENT, WALL, MettaGridEnv
    from envs.mettagrid.env import RENDER_CELL as CELL
    from envs.mettagrid.env import RENDER_COLOURS as COLOURS

    env = MettaGridEnv(num_envs=2, num_agents=4, map_width=10, map_height=8, max_steps=20)
    td = env.reset()
    assert env.can_render
    centre = CELL // 2
    for _ in range(3):
        for index in range(2):
            image = env.render(index)
            engine = env._engines[index]
            assert_frame(image, (engine.map_height * CELL, engine.map_width * CELL))
            agents = [cell for cell in engine.grid_objects().values() if cell["type_name"] == "agent"]
            assert len(agents) == 4
            for agent in agents:
                assert tuple(image[agent["r"] * CELL + centre, agent["c"] * CELL + centre]) == tuple(COLOURS[AGENT])
            assert tuple(image[centre, centre]) == tuple(COLOURS[WALL])  # the border
        action = TensorDict({"action": torch.randint(0, env.num_actions, (2, 4))}, batch_size=[2, 4])
        td = env.step(td.update(action))["next"]


def test_a_gymnasium_environment_renders_its_rgb_array_where_the_cart_is():
    from envs.gym.env import GymnasiumEnv

    env = GymnasiumEnv(num_envs=2, env_id="CartPole-v1", seed=3, render=True)
    td = env.reset()
    for _ in range(8):
        frame = env.render(1)
        assert frame.dtype == np.uint8 and frame.shape == (400, 600, 3)
        # CartPole draws its cart black, 50 pixels wide, centred at x * (600 / 4.8) + 300 (its world is 4.8 wide); the
        # pole may cover part of it, not its ends.
        black = np.all(frame == 0, axis=-1)
        columns = np.nonzero(black[black.sum(1) < 100])[1]  # not the track's line, which crosses the whole frame
        centre = (columns.min() + columns.max()) / 2
        assert abs(centre - (float(td["observation"][1, 0]) * 600 / 4.8 + 300)) <= 1.5
        td = env.step(td.set("action", env.action_spec.rand().fill_(1)))["next"]
    env.close()
