"""MettaGridEnv: specs, tokens, the altar task's reward, batched-vs-single games, partial resets, exact resume (also
through ParallelEnv workers), and option errors."""

from __future__ import annotations

import functools
import io

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import ParallelEnv
from torchrl.envs.utils import check_env_specs

pytest.importorskip("mettagrid", reason='the metta extra: pip install -e ".[metta]"')

from envs.mettagrid.env import MettaGridEnv

# A tiny game: 4 agents, 4 altars and 2 walls on 8x8 cells, 12-step episodes (several restarts in a short test).
SMALL = {"num_agents": 4, "map_width": 8, "map_height": 8, "objects": {"altar": 4, "wall": 2}, "max_steps": 12}
KEYS = ("observation", "reward", "done", "terminated", "truncated")


def play(env: MettaGridEnv, actions: torch.Tensor, td: TensorDict | None = None) -> tuple[list[TensorDict], TensorDict]:
    """Step ``actions`` ``[steps, num_envs, num_agents]`` with auto-reset; the ``next`` entries of every step."""
    td = env.reset() if td is None else td
    out = []
    for action in actions:
        td["action"] = action
        result, td = env.step_and_maybe_reset(td)
        out.append(result["next"].select(*KEYS).clone())
    return out, td


def assert_same_games(a: list[TensorDict], b: list[TensorDict]) -> None:
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in KEYS:
            assert torch.equal(x[key], y[key]), (t, key)


def test_specs_shapes_and_dtypes():
    env = MettaGridEnv(num_envs=2, **SMALL)
    check_env_specs(env)
    td = env.rand_step(env.reset())
    assert env.batch_size == (2, 4) and env.action_spec.space.n == 5 and env.action_spec.shape == (2, 4)
    assert td["observation"].shape == (2, 4, 200, 3) and td["observation"].dtype == torch.uint8
    assert td["action"].shape == (2, 4)
    for key, dtype in (("reward", torch.float32), ("done", torch.bool), ("terminated", torch.bool)):
        assert td["next", key].shape == (2, 4, 1) and td["next", key].dtype == dtype


def test_tokens_decode_into_the_egocentric_view():
    env = MettaGridEnv(num_envs=1, seed=4)  # the shipped default task
    layout = env.observation_layout
    tokens = env.rand_step(env.reset())["next", "observation"][0]  # [agents, tokens, 3]
    location, feature, value = tokens.long().unbind(-1)
    padding = feature == 0xFF
    assert (tokens[padding] == 0xFF).all()  # padding fills all three bytes
    assert (padding.long().diff(dim=-1) >= 0).all()  # and only follows the last real token
    real = ~padding
    assert (feature[real] < layout.num_features).all()
    names = [layout.feature_names[f] for f in feature[real & (location == layout.global_location)].tolist()]
    assert set(names) == {"episode_completion_pct", "last_action", "last_reward"}
    spatial = real & (location != layout.global_location)
    assert ((location[spatial] >> 4) < layout.height).all() and ((location[spatial] & 15) < layout.width).all()
    tag = layout.feature_names.index("tag")
    centre = (layout.height // 2) << 4 | layout.width // 2
    is_tag = spatial & (feature == tag)
    agent_tag, altar_tag = layout.tag_names.index("type:agent"), layout.tag_names.index("type:altar")
    assert agent_tag > 0 and altar_tag > 0  # no object type reads as a zero value
    assert ((is_tag & (location == centre) & (value == agent_tag)).sum(-1) == 1).all()  # each agent sees itself
    assert (is_tag & (value == altar_tag)).any()


def test_an_altar_gives_a_heart_once_per_cooldown():
    # One agent beside one altar on a 2x1 play area: walking into it every step pays every `altar_cooldown` steps.
    options = {"num_agents": 1, "map_width": 2, "map_height": 1, "objects": {"wall": 0, "altar": 1}}
    env = MettaGridEnv(num_envs=1, altar_cooldown=3, max_steps=20, **options)
    td = env.reset()
    layout = env.observation_layout
    tokens = td["observation"][0, 0].long()
    altar = (tokens[:, 1] == layout.feature_names.index("tag")) & (tokens[:, 2] == layout.tag_names.index("type:altar"))
    toward = 4 if int(tokens[altar][0, 0]) & 15 > layout.width // 2 else 3  # east or west
    rewards = []
    for _ in range(10):
        td["action"] = torch.full((1, 1), toward)
        out, td = env.step_and_maybe_reset(td)
        rewards.append(out["next", "reward"].item())
    assert rewards == [1, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    hearts = out["next", "observation"][0, 0].long()
    own = (hearts[:, 0] == (layout.height // 2) << 4 | layout.width // 2) & (
        hearts[:, 1] == layout.feature_names.index("inv:heart")
    )
    assert hearts[own][0, 2].item() == 4  # the agent sees its hearts


def test_random_agents_earn_hearts_on_the_default_task_and_nothing_in_the_stock_arena():
    torch.manual_seed(0)
    altars = MettaGridEnv(num_envs=1, seed=1)
    rewards = torch.stack([r["reward"] for r in play(altars, torch.randint(0, 5, (300, 1, 24)))[0]])
    assert rewards.sum() > 0 and set(rewards.unique().tolist()) <= {0.0, 1.0}
    arena = MettaGridEnv(num_envs=1, task="arena", seed=1)
    rewards = torch.stack([r["reward"] for r in play(arena, torch.randint(0, 5, (100, 1, 24)))[0]])
    assert rewards.abs().sum() == 0


def test_a_batch_plays_the_games_of_single_environments_across_auto_resets():
    torch.manual_seed(1)
    actions = torch.randint(0, 5, (30, 3, 4))
    batched, _ = play(MettaGridEnv(num_envs=3, seed=5, **SMALL), actions)
    assert sum(int(b["done"].all(-2).sum()) for b in batched) == 6  # every environment restarted twice
    assert all(torch.equal(b["done"].any(-2), b["done"].all(-2)) for b in batched)  # its agents end together
    assert sum(float(b["reward"].sum()) for b in batched) > 0
    for i in range(3):
        single, _ = play(MettaGridEnv(num_envs=1, seed=5 + i, **SMALL), actions[:, i : i + 1])
        assert_same_games([b[i : i + 1] for b in batched], single)


def test_a_partial_reset_restarts_only_the_flagged_environment_and_all_its_agents():
    env = MettaGridEnv(num_envs=3, seed=7, **SMALL)
    _, td = play(env, torch.randint(0, 5, (3, 3, 4)))
    before = td["observation"].clone()
    flags = torch.zeros(3, 4, 1, dtype=torch.bool)
    flags[1, 0] = True  # one agent of environment 1
    td["_reset"] = flags
    after = env.reset(td)["observation"]
    assert torch.equal(after[0], before[0]) and torch.equal(after[2], before[2])
    fresh = MettaGridEnv(num_envs=1, seed=8, **SMALL)
    fresh.reset()
    assert torch.equal(after[1], fresh.reset()["observation"][0])  # episode 1 of stream 8, for every agent
    assert env._steps.tolist() == [3, 0, 3]


def test_set_seed_replays_the_same_episodes():
    env = MettaGridEnv(num_envs=2, seed=0, **SMALL)
    env.set_seed(11)
    first = env.reset()["observation"]
    env.reset()
    env.set_seed(11)
    assert torch.equal(env.reset()["observation"], first)


def test_a_loaded_state_continues_exactly_like_the_uninterrupted_environment():
    torch.manual_seed(2)
    actions = torch.randint(0, 5, (35, 2, 4))
    env = MettaGridEnv(num_envs=2, seed=3, **SMALL)
    _, td = play(env, actions[:17])  # mid-way through the second episodes
    buffer = io.BytesIO()
    torch.save(env.state_dict(), buffer)
    buffer.seek(0)
    copy = MettaGridEnv(num_envs=2, seed=99, **SMALL)  # another seed, never reset: the state decides everything
    copy.load_state_dict(torch.load(buffer, weights_only=True))
    carried = td.clone()
    expected, _ = play(env, actions[17:], td)
    resumed, _ = play(copy, actions[17:], carried)
    assert_same_games(expected, resumed)  # through two more restarts
    with pytest.raises(ValueError, match="its environment state is for another game"):
        MettaGridEnv(num_envs=2, seed=3, **{**SMALL, "altar_cooldown": 4}).load_state_dict(copy.state_dict())


@pytest.mark.slow
def test_parallel_workers_step_and_hand_their_state_over_both_ways():
    torch.manual_seed(3)
    actions = torch.randint(0, 5, (20, 2, 2, 4))
    factories = [functools.partial(MettaGridEnv, num_envs=2, seed=10 + 2 * w, **SMALL) for w in range(2)]
    penv = ParallelEnv(2, factories, num_threads=1, num_sub_threads=1)
    try:
        out, _ = play(penv, actions[:5])
        assert out[0]["observation"].shape == (2, 2, 4, 200, 3) and out[0]["reward"].shape == (2, 2, 4, 1)
        states = penv.env_state()  # one per worker, in worker order
        local = [MettaGridEnv(num_envs=2, seed=0, **SMALL) for _ in range(2)]
        for env, state in zip(local, states, strict=True):
            env.load_env_state(state)
        expected, ptd = play(penv, actions[5:15], TensorDict({}, batch_size=penv.batch_size))
        for w, env in enumerate(local):
            resumed, _ = play(env, actions[5:15, w], TensorDict({}, batch_size=env.batch_size))
            assert_same_games([e[w] for e in expected], resumed)
        for w, env in enumerate(local):
            env.rand_step()  # the workers must take these states, not keep theirs
            penv[w].load_env_state(env.env_state())
        back, _ = play(penv, actions[15:], ptd)
        for w, env in enumerate(local):
            resumed, _ = play(env, actions[15:, w], TensorDict({}, batch_size=env.batch_size))
            assert_same_games([b[w] for b in back], resumed)
    finally:
        penv.close()


def test_stepping_needs_a_running_episode_and_close_releases_the_engines():
    env = MettaGridEnv(num_envs=1, **{**SMALL, "max_steps": 2})
    with pytest.raises(RuntimeError, match="reset the environment"):
        env.step(TensorDict({"action": torch.zeros(1, 4, dtype=torch.long)}, batch_size=[1, 4]))
    env.reset()
    for _ in range(2):
        env.rand_step()
    with pytest.raises(RuntimeError, match="finished its episode"):
        env.rand_step()
    env.close()
    assert env._engines == [None] and env.state_dict()["_extra_state"]["episode_seed"].tolist() == [-1]
    assert env.reset()["observation"].shape == (1, 4, 200, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_agents": 0}, "num_agents must be > 0, got 0"),
        ({"num_envs": 0}, "num_envs must be > 0"),
        ({"max_steps": 0}, "max_steps must be > 0"),
        ({"altar_cooldown": 0}, "altar_cooldown must be > 0"),
        ({"task": "maze"}, "task must be one of altars, arena, got 'maze'"),
        ({"objects": {"chest": 3}}, r"objects names 'chest', which task 'altars' does not have \(it has wall, altar\)"),
        ({"task": "arena", "objects": {"altar": 3}}, "objects names 'altar', which task 'arena' does not have"),
        ({"objects": {"altar": -1}}, "objects must count each object >= 0, got altar: -1"),
        ({"map_width": 0}, "map_width and map_height must be > 0"),
        ({"map_width": 5, "map_height": 5}, r"map_width x map_height \(5x5 = 25 cells\) cannot hold 24 agents and 30"),
    ],
)
def test_invalid_options_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MettaGridEnv(**kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tensors_live_on_the_requested_device():
    env = MettaGridEnv(num_envs=2, device="cuda", **SMALL)
    out, td = play(env, torch.randint(0, 5, (15, 2, 4), device="cuda"))
    assert td["observation"].device.type == "cuda" and out[-1]["reward"].device.type == "cuda"
