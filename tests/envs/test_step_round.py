"""The Gymnasium family's round written as it steps (``CopyBatchEnv.step_round``, which every in-process collector
round of these environments takes: ``compat.torchrl.round_on_carrier``) against the same steps taken one by one
through ``step_and_maybe_reset`` and stacked, the road of TorchRL's collectors: the same rounds to the bit, the same
carrier after each, the environments left where the other road leaves them; on real tasks whose episodes end inside
rounds (at different steps for different copies), one-hot observations, the return before the wrappers, truncation,
an Atari game's lost lives, and envpool's engine."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch
import yaml
from tensordict import TensorDict, TensorDictBase

from compat.tensordict import stack_steps, top_level_entries
from compat.torchrl import round_on_carrier
from envs.gym.env import GymnasiumEnv
from tests.helpers import ROOT

needs = {
    name: pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module}: pip install -e '.[{extra}]'")
    for name, module, extra in [("box2d", "Box2D", "gym"), ("ale", "ale_py", "gym"), ("envpool", "envpool", "envpool")]
}
BREAKOUT = yaml.safe_load((ROOT / "configs/gym/breakout_ppo.yaml").read_text())["data"]["init_args"]["env"]["init_args"]


def gymnasium_env(**options: Any) -> GymnasiumEnv:
    return GymnasiumEnv(seed=3, **options)


def envpool_env(**options: Any):
    from envs.gym.envpool_env import EnvpoolEnv  # noqa: PLC0415 (after the skip)

    return EnvpoolEnv(seed=3, **options)


def acting_in_place(env) -> Callable[[TensorDictBase], TensorDictBase]:
    """A random policy that writes its action on its input, as the agents' acting policies do."""

    def policy(tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set("action", env.action_spec.rand())

    return policy


def acting_with_extras(env) -> Callable[[TensorDictBase], TensorDictBase]:
    """A random policy that returns a new tensordict with its action and a value beside it (merged by the caller); the
    value reads every entry of its input, so the input between steps is compared too."""

    def policy(tensordict: TensorDictBase) -> TensorDictBase:
        value = torch.rand(tensordict.shape[0], 1)
        for entry in tensordict.values():
            value = value + entry.float().reshape(len(value), -1).sum(-1, keepdim=True)
        return TensorDict({"action": env.action_spec.rand(), "value": value}, tensordict.batch_size)

    return policy


def stepped_one_by_one(env, policy, carrier: TensorDictBase, steps: int, keys: list[str]):
    """The steps through ``step_and_maybe_reset``, stacked: what ``round_on_carrier`` does where ``step_round`` is not
    offered (and TorchRL's ``Collector.rollout`` in its plain case)."""
    taken = []
    for _ in range(steps):
        acted = policy(carrier)
        if acted is not carrier:
            carrier.update(acted, keys_to_update=keys)
        stepped, following = env.step_and_maybe_reset(carrier)
        taken.append(stepped)
        carrier = following
    return stack_steps(taken), carrier


def assert_same(ours: TensorDictBase, theirs: TensorDictBase) -> None:
    assert list(ours.keys(True, True)) == list(theirs.keys(True, True))  # the same entries, in the same order
    assert ours.batch_size == theirs.batch_size
    for key in theirs.keys(True, True):
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key


def play(make: Callable[[], Any], acting, rounds: int, steps: int, one_by_one: bool) -> tuple[list, list, int]:
    torch.manual_seed(0)
    env = make()
    policy, keys = acting(env), ["action", "value"] if acting is acting_with_extras else ["action"]
    carrier = env.reset()
    batches, carriers = [], []
    for _ in range(rounds):
        if one_by_one:
            batch, carrier = stepped_one_by_one(env, policy, carrier, steps, keys)
        else:
            with torch.no_grad():
                batch, carrier = env.step_round(policy, carrier, steps, keys)
        batches.append(batch)
        carriers.append(carrier.clone())
    ended = int(torch.cat([batch["next", "done"].reshape(-1) for batch in batches]).sum())
    env.close()
    return batches, carriers, ended


CASES = {
    # 3 copies whose episodes end at different steps of the rounds
    "cartpole x3": (lambda: gymnasium_env(num_envs=3, env_id="CartPole-v1"), 30, 7, 8),
    # a Discrete observation, written as its one-hot row; episodes of a few steps
    "frozenlake one-hot": (lambda: gymnasium_env(num_envs=2, env_id="FrozenLake-v1"), 20, 5, 8),
    # the return before the wrappers, truncation by a short time limit, one copy
    "pendulum wrapped": (
        lambda: gymnasium_env(
            env_id="Pendulum-v1",
            env_kwargs={"max_episode_steps": 9},
            wrappers=[{"class_path": "ClipReward", "init_args": {"min_reward": -1.0, "max_reward": 0.0}}],
        ),
        24,
        4,
        8,
    ),
    "lunarlander x1": pytest.param(lambda: gymnasium_env(env_id="LunarLander-v3"), 60, 4, 1, marks=needs["box2d"]),
    "breakout lives": pytest.param(
        lambda: gymnasium_env(num_envs=2, **BREAKOUT), 40, 16, 1, marks=[needs["ale"], pytest.mark.slow]
    ),
    "envpool cartpole x4": pytest.param(
        lambda: envpool_env(num_envs=4, env_id="CartPole-v1"), 25, 8, 8, marks=needs["envpool"]
    ),
}


@pytest.mark.parametrize("acting", [acting_in_place, acting_with_extras], ids=["in place", "new tensordict"])
@pytest.mark.parametrize(("make", "rounds", "steps", "episodes"), list(CASES.values()), ids=list(CASES))
def test_a_round_written_as_it_steps_is_the_steps_stacked(make, rounds, steps, episodes, acting):
    ours, our_carriers, ended = play(make, acting, rounds, steps, one_by_one=False)
    theirs, their_carriers, their_ended = play(make, acting, rounds, steps, one_by_one=True)
    assert ended == their_ended >= episodes  # episodes end inside the rounds: the restarts are compared too
    for batch, expected in zip([*ours, *our_carriers], [*theirs, *their_carriers], strict=True):
        assert_same(batch, expected)


def test_the_carrier_after_a_round_holds_its_own_tensors():
    env = gymnasium_env(num_envs=2, env_id="CartPole-v1")
    batch, carrier = env.step_round(acting_in_place(env), env.reset(), 3, ["action"])
    shared = [
        key
        for key, value in top_level_entries(carrier).items()
        for other in batch.values(True, True)
        if value.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()
    ]
    assert shared == []  # a write into the stored round leaves the next round's input as it is


def test_what_the_round_cannot_write_is_left_to_the_steps_one_by_one():
    env = gymnasium_env(num_envs=2, env_id="CartPole-v1")
    policy = acting_in_place(env)
    nested = env.reset().set("memory", TensorDict({"h": torch.zeros(2, 3)}, [2]))
    assert env.step_round(policy, nested, 3, ["action"]) is None  # a recurrent state: the general road
    env.run_type_checks = True
    assert env.step_round(policy, env.reset(), 3, ["action"]) is None

    env.run_type_checks = False
    calls = []

    def changing(tensordict: TensorDictBase) -> TensorDictBase:  # writes one more entry from its second call on
        calls.append(None)
        if len(calls) == 2:
            tensordict.set("extra", torch.zeros(2, 1))
        return tensordict.set("action", env.action_spec.rand())

    with pytest.raises(RuntimeError, match=r"^the policy's entries changed within a round: \['action', 'extra'\]"):
        env.step_round(changing, env.reset(), 3, ["action", "extra"])


@pytest.mark.parametrize("num_envs", [1, 3])
def test_a_collectors_rounds_take_the_written_road(num_envs, monkeypatch):
    """Every in-process round of a Gymnasium config takes step_round (no step_and_maybe_reset call)."""
    from app.cli import build  # noqa: PLC0415

    model, data = build([str(ROOT / "configs/gym/cartpole_dqn.yaml")], ["--data.init_args.num_envs", str(num_envs)])
    data.setup("fit")
    data.connect(model.policy(), None, model.batch_keys())
    data._build_collector()
    try:
        data.collect()  # the collector's first round: TorchRL's own
        monkeypatch.setattr(GymnasiumEnv, "step_and_maybe_reset", lambda *_: pytest.fail("stepped one by one"))
        batch = round_on_carrier(data.collector, 5)
        assert batch.batch_size == (num_envs, 5)
    finally:
        data.collection.teardown()


def test_a_carrier_that_says_done_is_cleared_after_the_first_step_as_the_steps_one_by_one_clear_it():
    rounds = []
    for one_by_one in (False, True):
        torch.manual_seed(0)
        env = gymnasium_env(num_envs=2, env_id="CartPole-v1")
        carrier = env.reset()
        for key in ("terminated", "done"):  # as a caller might hand it: the flags of a step the copies restarted from
            carrier[key][0] = True
        policy = acting_with_extras(env)  # reads every entry of its input, flags included
        if one_by_one:
            rounds.append(stepped_one_by_one(env, policy, carrier, 3, ["action", "value"]))
        else:
            rounds.append(env.step_round(policy, carrier, 3, ["action", "value"]))
    (ours, our_carrier), (theirs, their_carrier) = rounds
    assert ours["done"][:, 0].any() and not ours["done"][:, 1:].any()
    assert_same(ours, theirs)
    assert_same(our_carrier, their_carrier)
