"""Snake rules on hand-made boards, batched-vs-single agreement, exact state round trips, and spec checks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from envs.snake.env import SnakeEnv

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3


def place(env: SnakeEnv, body: list[tuple[int, int]], heading: int, food: tuple[int, int] | None) -> None:
    """Put a hand-made game on board 0: ``body`` from tail to head, ``(row, col)`` cells."""
    size, cells = env.size, env.cells
    env.board[0] = 0
    for k, (row, col) in enumerate(body):
        env.trail[0, k] = row * size + col
        env.board[0, row * size + col] = 1
    head_row, head_col = body[-1]
    env.board[0, cells + head_row * size + head_col] = 1
    env.head_row[0], env.head_col[0], env.heading[0] = head_row, head_col, heading
    env.tail_slot[0], env.length[0], env.steps[0] = 0, len(body), 0
    env.food[0] = -1 if food is None else food[0] * size + food[1]
    if food is not None:
        env.board[0, 2 * cells + env.food[0]] = 1


def step(env: SnakeEnv, action: int) -> TensorDict:
    return env.step(TensorDict({"action": torch.tensor([action])}, batch_size=[1]))["next"]


def planes(td: TensorDict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    body, head, food = td["observation"][0]
    return body, head, food


def cells_of(plane: torch.Tensor) -> set[tuple[int, int]]:
    return {tuple(cell) for cell in plane.nonzero().tolist()}


@pytest.fixture(params=["torch", "cpp"])
def env(request) -> SnakeEnv:
    """Every rule test runs on both implementations: torch ops and the compiled CPU loop."""
    env = SnakeEnv(num_envs=1, size=6, spawn_margin=0, seed=3, backend=request.param)
    env.reset()
    return env


def test_moving_shifts_the_body_and_keeps_the_length(env):
    place(env, [(2, 1), (2, 2), (2, 3)], RIGHT, food=(5, 5))
    out = step(env, RIGHT)
    body, head, food = planes(out)
    assert cells_of(body) == {(2, 2), (2, 3), (2, 4)}
    assert cells_of(head) == {(2, 4)}
    assert cells_of(food) == {(5, 5)}
    assert out["reward"].item() == 0 and not out["done"].item()


def test_observations_are_snapshots_not_views_of_the_live_board(env):
    place(env, [(2, 1), (2, 2), (2, 3)], RIGHT, food=(5, 5))
    first = step(env, RIGHT)["observation"]
    kept = first.clone()
    step(env, DOWN)
    step(env, LEFT)
    assert torch.equal(first, kept)


def test_eating_grows_the_snake_and_respawns_food_off_the_body(env):
    place(env, [(2, 1), (2, 2), (2, 3)], RIGHT, food=(2, 4))
    out = step(env, RIGHT)
    body, _, food = planes(out)
    assert out["reward"].item() == 1 and out["food"].item() == 1
    assert cells_of(body) == {(2, 1), (2, 2), (2, 3), (2, 4)}  # the tail stayed: one block longer
    assert env.length[0] == 4
    assert len(cells_of(food)) == 1 and not cells_of(food) & cells_of(body)


def test_walls_kill(env):
    place(env, [(0, 3), (0, 4), (0, 5)], RIGHT, food=(5, 0))
    out = step(env, RIGHT)
    assert out["reward"].item() == -1 and out["terminated"].item() and out["done"].item()


def test_running_into_the_own_body_kills(env):
    # A 5-block snake curling back on itself; its head at (1,3) turns left into (1,2), a body cell.
    place(env, [(3, 3), (3, 2), (2, 2), (1, 2), (1, 3)], DOWN, food=(5, 5))
    out = step(env, LEFT)  # (1,3) → (1,2): the neck
    assert out["terminated"].item() and out["reward"].item() == -1


def test_following_the_tail_into_its_vacated_cell_is_legal(env):
    # A 4-block square loop: the head moves into the cell the tail leaves on this very step.
    place(env, [(2, 2), (2, 3), (3, 3), (3, 2)], LEFT, food=(5, 5))
    out = step(env, UP)
    assert not out["done"].item() and out["reward"].item() == 0
    assert cells_of(planes(out)[1]) == {(2, 2)}


def test_reversing_keeps_going_straight(env):
    place(env, [(2, 1), (2, 2), (2, 3)], RIGHT, food=(5, 5))
    out = step(env, LEFT)  # the opposite of RIGHT
    assert cells_of(planes(out)[1]) == {(2, 4)} and not out["done"].item()


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_a_full_board_ends_the_episode(backend):
    env = SnakeEnv(num_envs=1, size=3, spawn_margin=0, backend=backend)
    env.reset()
    # A snake filling 8 of 9 cells in a serpentine, the food on the last cell, next to the head.
    place(env, [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1)], RIGHT, food=(2, 2))
    out = step(env, RIGHT)
    assert out["reward"].item() == 1 and out["terminated"].item()
    assert env.food[0] == -1 and planes(out)[2].sum() == 0


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_episodes_are_truncated_at_max_steps(backend):
    env = SnakeEnv(num_envs=1, size=6, max_steps=3, spawn_margin=0, backend=backend)
    env.reset()
    place(env, [(2, 0), (2, 1), (2, 2)], RIGHT, food=(5, 5))
    outs = [step(env, action) for action in (RIGHT, DOWN, LEFT)]
    assert [o["truncated"].item() for o in outs] == [False, False, True]
    assert not outs[-1]["terminated"].item() and outs[-1]["done"].item()


def test_initial_snakes_have_three_blocks_inside_the_margin():
    env = SnakeEnv(num_envs=512, size=10, spawn_margin=3, seed=7)
    td = env.reset()
    body, head, food = td["observation"].unbind(1)
    assert (body.sum((1, 2)) == 3).all() and (head.sum((1, 2)) == 1).all() and (food.sum((1, 2)) == 1).all()
    assert body[:, :3].sum() == 0 and body[:, 7:].sum() == 0 and body[:, :, :3].sum() == 0 and body[:, :, 7:].sum() == 0
    assert (food * body).sum() == 0
    assert len(set(env.heading.tolist())) == 4  # all headings occur


@pytest.mark.parametrize(("size", "margin"), [(3, 0), (4, 0), (5, 1), (7, 2), (8, 2), (9, 3), (10, 3), (16, 3)])
def test_the_default_spawn_margin_is_the_largest_up_to_3_that_fits(size, margin):
    env = SnakeEnv(num_envs=256, size=size, seed=2)
    assert env.spawn_margin == margin
    body = env.reset()["observation"][:, 0]
    rows, cols = body.any(2), body.any(1)  # [boards, size]: which rows / columns hold a body cell
    inside = slice(margin, size - margin)
    assert not rows[:, :margin].any() and not rows[:, size - margin :].any()
    assert not cols[:, :margin].any() and not cols[:, size - margin :].any()
    assert rows[:, margin].any() and cols[:, size - margin - 1].any()  # the margin itself is reached: no wider
    assert (body[:, inside, inside].sum((1, 2)) == 3).all()


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_reset_with_a_mask_reinitialises_only_the_masked_boards(backend):
    env = SnakeEnv(num_envs=4, size=8, spawn_margin=1, seed=1, backend=backend)
    env.reset()
    before = env.board[:, : env.scratch].clone()  # the planes; the last byte of a row is write-only scratch
    mask = torch.tensor([[True], [False], [True], [False]])
    env.reset(TensorDict({"_reset": mask}, batch_size=[4]))
    after = env.board[:, : env.scratch]
    assert torch.equal(after[1], before[1]) and torch.equal(after[3], before[3])
    assert not torch.equal(after[0], before[0]) or not torch.equal(after[2], before[2])


def random_play(num_envs: int, seed: int, actions: torch.Tensor, backend: str = "auto") -> list[TensorDict]:
    env = SnakeEnv(num_envs=num_envs, size=6, spawn_margin=1, seed=seed, max_steps=50, backend=backend)
    td = env.reset()
    out = []
    for action in actions:
        td["action"] = action[:num_envs] if num_envs > 1 else action
        result, td = env.step_and_maybe_reset(td)
        out.append(result["next"].select("observation", "reward", "done", "terminated", "truncated", "food").clone())
    return out


@pytest.mark.parametrize("size", [4, 6])
def test_the_compiled_cpu_loop_plays_exactly_the_torch_games(size):
    torch.manual_seed(3)
    actions = torch.randint(0, 4, (400, 32))
    games = {}
    for backend in ("torch", "cpp"):
        env = SnakeEnv(num_envs=32, size=size, spawn_margin=0, seed=11, max_steps=60, backend=backend)
        td, steps = env.reset(), []
        for action in actions:
            td["action"] = action
            result, td = env.step_and_maybe_reset(td)
            steps.append(result["next"].clone())
        games[backend] = torch.stack(steps)
    assert (games["torch"]["food"].sum() > 20) and (games["torch"]["done"].sum() > 32)  # eating and dying happened
    assert (games["torch"] == games["cpp"]).all()


def test_batched_boards_match_separate_runs_under_the_same_actions_and_seed():
    torch.manual_seed(0)
    actions = torch.randint(0, 4, (300, 8))
    batched = random_play(8, seed=100, actions=actions)
    for i in range(8):
        single = random_play(1, seed=100 + i, actions=actions[:, i : i + 1])
        for t in range(300):
            assert torch.equal(batched[t][i : i + 1]["observation"], single[t]["observation"]), (i, t)
            assert torch.equal(batched[t][i : i + 1]["reward"], single[t]["reward"]), (i, t)
    assert sum(b["done"].sum().item() for b in batched) > 8  # episodes really ended and restarted


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_food_never_spawns_on_the_body_during_long_random_play(backend):
    torch.manual_seed(1)
    env = SnakeEnv(num_envs=256, size=5, spawn_margin=1, seed=5, max_steps=200, backend=backend)
    td = env.reset()
    eaten = 0
    for _ in range(400):
        td["action"] = torch.randint(0, 4, (256,))
        result, td = env.step_and_maybe_reset(td)
        body, _, food = result["next", "observation"].unbind(1)
        eaten += int(result["next", "food"].sum())
        running = ~result["next", "done"].view(-1)
        assert (body * food).sum() == 0
        assert (food[running].sum((1, 2)) == 1).all()  # one food while the game goes on
    assert eaten > 100


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(2)
    actions = torch.randint(0, 4, (60, 16))
    env = SnakeEnv(num_envs=16, size=6, spawn_margin=1, seed=9)
    td = env.reset()
    for action in actions[:30]:
        td["action"] = action
        _, td = env.step_and_maybe_reset(td)
    saved, carried = {k: v.clone() for k, v in env.state_dict().items()}, td.clone()
    copy = SnakeEnv(num_envs=16, size=6, spawn_margin=1, seed=12345)
    copy.reset()
    copy.load_state_dict(saved)
    td_copy = carried
    for action in actions[30:]:
        td["action"], td_copy["action"] = action, action.clone()
        out, td = env.step_and_maybe_reset(td)
        out_copy, td_copy = copy.step_and_maybe_reset(td_copy)
        assert torch.equal(out["next", "observation"], out_copy["next", "observation"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 8, "spawn_margin": 3}, "spawn_margin 3 leaves no room for the 3-block snake on a 8x8 board"),
        ({"size": 2}, "size must be >= 3 to fit the 3-block snake, got 2"),
        ({"num_envs": 0}, "num_envs"),
        ({"max_steps": 0}, "max_steps"),
        ({"spawn_margin": -1}, "spawn_margin"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SnakeEnv(**kwargs)


def test_specs_are_consistent():
    check_env_specs(SnakeEnv(num_envs=4, size=10))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda():
    env = SnakeEnv(num_envs=1024, device="cuda")
    td = env.reset()
    for _ in range(20):
        td["action"] = torch.randint(0, 4, (1024,), device="cuda")
        _, td = env.step_and_maybe_reset(td)
    assert td["observation"].device.type == "cuda"
