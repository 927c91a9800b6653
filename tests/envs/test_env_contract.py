"""The environment contract (``envs/base.py``), checked for every environment in ``envs``.

The environments are found by walking the package, so a new one is covered as soon as its file exists. Each is built
small (``OPTIONS``: short episodes, so a few dozen steps cross several resets; options off their defaults, so a
rebuild that dropped one would show) and checked: its specs match what it returns (TorchRL's ``check_env_specs``),
the same seed plays the same episodes, a copy rebuilt from ``init_kwargs()`` plays them too, the collectors' step
(``step_and_maybe_reset``, :class:`~compat.torchrl.FastStepAndMaybeReset`) returns what TorchRL's own does, and
``state_dict()``
loaded into a new environment continues exactly (skipped, with the reason it declares, for an environment with
``exact_state = False``). An optional family (MettaGrid, Mario) is skipped only when its package is not installed.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase, Transform
from torchrl.envs.utils import check_env_specs

import envs
from envs.base import BATCH_ARGUMENTS, BatchedEnv
from envs.snake.env import SnakeEnv

#: Options for the environments here: short episodes, small batches; a new environment runs with its defaults.
OPTIONS: dict[str, dict[str, Any]] = {
    "SnakeEnv": {"size": 6, "max_steps": 15},
    "ChainEnv": {"length": 4, "max_steps": 6},
    "CueRecallEnv": {"num_agents": 3, "length": 3},
    "ToyEnv": {"tau_max": 0.5, "sigma": 0.3},
    "VehicleEnv": {"tau_max": 0.5, "start_spread": 0.5},
    "RacingEnv": {"max_steps": 15, "curvature_ahead": [5.0, 15.0]},
    "MettaGridEnv": {
        "num_agents": 3,
        "map_width": 8,
        "map_height": 8,
        "max_steps": 10,
        "objects": {"altar": 4, "wall": 2},
    },
    "MarioEnv": {"frame_skip": 2, "size": 32, "frame_stack": 2, "stuck_steps": 4, "noop_max": 2},  # 0.3 s an emulator
    "EnvpoolEnv": {"env_id": "CartPole-v1", "env_kwargs": {"max_episode_steps": 6}, "num_threads": 2},
    "GymnasiumEnv": {
        "env_id": "Acrobot-v1",
        "env_kwargs": {"max_episode_steps": 10},
        "wrappers": ["TimeAwareObservation"],
    },
}
NUM_ENVS, STEPS = 2, 30


def environment_classes() -> list[Any]:
    """Every concrete :class:`BatchedEnv` defined in the package, as pytest params; a module whose third-party
    package is missing is one skipped param (any other import error fails the collection)."""
    params = []
    for info in pkgutil.walk_packages(envs.__path__, "envs."):
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as error:
            if error.name is None or error.name.split(".")[0] in ("envs", "datamodules", "compat"):
                raise
            reason = f"{info.name} needs {error.name}, which is not installed"
            params.append(pytest.param(None, id=info.name, marks=pytest.mark.skip(reason=reason)))
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BatchedEnv) and cls.__module__ == module.__name__ and not inspect.isabstract(cls):
                params.append(pytest.param(cls, id=cls.__name__))
    return params


ENVIRONMENTS = environment_classes()


def build(cls: type[BatchedEnv], seed: int = 3, **options: Any) -> BatchedEnv:
    return cls(num_envs=NUM_ENVS, seed=seed, device="cpu", **(options or OPTIONS.get(cls.__name__, {})))


def random_actions(env: BatchedEnv, steps: int = STEPS, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [env.action_spec.rand() for _ in range(steps)]


def play(
    env: BatchedEnv, actions: Sequence[torch.Tensor], td: TensorDictBase | None = None
) -> tuple[list[TensorDictBase], TensorDictBase]:
    """Each step's tensordict (with its ``next``) under ``actions``, resetting finished environments as a collector
    does, from a reset or from ``td``; and the tensordict carried after the last step."""
    td = env.reset() if td is None else td
    steps = []
    for action in actions:
        td["action"] = action.clone()
        stepped, td = env.step_and_maybe_reset(td)
        steps.append(stepped.clone())
    return steps, td


def assert_same_episodes(first: list[TensorDictBase], second: list[TensorDictBase]) -> None:
    assert len(first) == len(second)
    for step, (a, b) in enumerate(zip(first, second, strict=True)):
        keys = set(a.keys(True, True))
        assert keys == set(b.keys(True, True)), step
        for key in keys:
            assert torch.equal(a[key], b[key]), (step, key)


def assert_episodes_ended(cls: type[BatchedEnv], steps: list[TensorDictBase]) -> None:
    """With the short episodes of ``OPTIONS`` the steps cross resets, so the checks above cover them too."""
    if cls.__name__ in OPTIONS:
        assert any(bool(step["next", "done"].any()) for step in steps), f"{cls.__name__}: no episode ended"


def test_the_walk_finds_the_environments():
    names = {param.values[0].__name__ for param in ENVIRONMENTS if param.values[0] is not None}
    assert {"SnakeEnv", "ChainEnv", "CueRecallEnv", "ToyEnv", "VehicleEnv", "RacingEnv"} <= names
    assert len(ENVIRONMENTS) >= len(OPTIONS)  # the optional two found or skipped, never missed


@pytest.mark.parametrize("cls", ENVIRONMENTS)
def test_the_constructor_takes_the_batch_and_named_options(cls):
    # The constructor's own signature (TorchRL's EnvBase defines a __new__ that would hide it).
    parameters = dict(list(inspect.signature(cls.__init__).parameters.items())[1:])
    for name in BATCH_ARGUMENTS:
        assert name in parameters and parameters[name].default is not inspect.Parameter.empty, name
    env = build(cls)
    options = env.init_kwargs()
    assert not set(options) & set(BATCH_ARGUMENTS)
    assert options.items() >= OPTIONS.get(cls.__name__, {}).items()  # what it was given, defaults beside
    assert set(options) == set(parameters) - set(BATCH_ARGUMENTS)
    assert set(env.full_done_spec.keys()) == {"done", "terminated", "truncated"}
    assert set(cls.episode_metric_keys) <= set(env.observation_spec.keys())
    assert set(cls.episode_metric_over) | set(cls.episode_metric_over.values()) <= set(cls.episode_metric_keys)
    # The declaration carries every declaration of the environment, and nothing the rest reads it from is left out.
    declared = env.declaration()
    assert (declared.env_class, declared.options) == (cls, options)
    assert declared.episode_metric_keys == tuple(cls.episode_metric_keys)
    assert dict(declared.episode_metric_over) == dict(cls.episode_metric_over)
    assert (declared.physics, declared.observation_layout) == (env.physics, env.observation_layout)
    assert (declared.can_render, dict(declared.render_options)) == (cls.can_render, dict(cls.render_options))
    assert (declared.exact_state, declared.inexact_state_reason) == (cls.exact_state, cls.inexact_state_reason)
    env.close()


@pytest.mark.parametrize("cls", ENVIRONMENTS)
def test_specs_match_what_the_environment_returns(cls):
    env = build(cls)
    check_env_specs(env, seed=0)
    env.close()


@pytest.mark.parametrize("cls", ENVIRONMENTS)
def test_the_same_seed_and_a_rebuild_from_init_kwargs_play_the_same_episodes(cls):
    env = build(cls)
    actions = random_actions(env)
    episodes, _ = play(env, actions)
    assert_episodes_ended(cls, episodes)
    again, _ = play(build(cls), actions)
    assert_same_episodes(episodes, again)
    rebuilt = build(cls, **env.init_kwargs())
    assert rebuilt.init_kwargs() == env.init_kwargs()
    assert_same_episodes(episodes, play(rebuilt, actions)[0])
    # What a worker process rebuilds it from: the declaration, pickled across, with its options.
    declared = pickle.loads(pickle.dumps(env.declaration()))
    redeclared = declared.env_class(num_envs=NUM_ENVS, seed=3, device="cpu", **declared.options)
    assert type(redeclared) is cls and redeclared.init_kwargs() == env.init_kwargs()
    assert_same_episodes(episodes, play(redeclared, actions)[0])
    for each in (env, rebuilt, redeclared):
        each.close()


@pytest.mark.parametrize("cls", ENVIRONMENTS)
def test_the_fast_step_returns_what_torchrls_step_and_maybe_reset_returns(cls, monkeypatch):
    fast, reference = build(cls), build(cls)
    # The fast road is taken: TorchRL's is refused on `fast` (it is what the fallback and `reference` call).
    torchrls = EnvBase._step_and_maybe_reset
    monkeypatch.setattr(fast, "_step_and_maybe_reset", lambda td: pytest.fail("the fast road was not taken"))
    batch = fast.batch_size
    policy_outputs = {"logits": torch.randn(*batch, 3), ("collector", "traj_ids"): torch.randint(9, batch)}
    td_fast, td_reference = fast.reset(), reference.reset()
    steps = []
    for step, action in enumerate(random_actions(fast)):
        for td in (td_fast, td_reference):
            td["action"] = action.clone()
            for key, value in policy_outputs.items():  # entries a policy and a collector add: carried over
                td[key] = value.clone()
        stepped_fast, td_fast = fast.step_and_maybe_reset(td_fast)
        stepped_reference, td_reference = torchrls(reference, td_reference)
        for mine, theirs, what in ((stepped_fast, stepped_reference, "stepped"), (td_fast, td_reference, "next in")):
            assert set(mine.keys(True, True)) == set(theirs.keys(True, True)), (step, what)
            assert mine.batch_size == theirs.batch_size and mine.device == theirs.device, (step, what)
            for key in theirs.keys(True, True):
                assert torch.equal(mine[key], theirs[key]), (step, what, key)
        assert td_fast["collector"] is not stepped_fast["collector"]  # a sub-tensordict is copied, as TorchRL does
        steps.append(stepped_fast)
    assert_episodes_ended(cls, steps)  # the resets between steps are compared too
    for each in (fast, reference):
        each.close()


class _HookAfterStepMdp(Transform):
    """A transform that hooks into what follows ``step_mdp`` (as TorchRL's ``NextObservationDelta`` does), counting its
    calls and changing nothing."""

    calls = 0

    def _post_step_mdp_hooks(self, tensordict: TensorDictBase, tensordict_: TensorDictBase) -> tuple:
        type(self).calls += 1
        return tensordict, tensordict_


class _Inverse(Transform):
    """A transform with an inverse (as TorchRL's action transforms have), counting its calls and changing nothing."""

    calls = 0

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        type(self).calls += 1
        return tensordict


@pytest.mark.parametrize(
    "extra", [None, "hook", "inverse"], ids=["plain chain", "a transform hooks after step_mdp", "an inverse transform"]
)
def test_a_transformed_environment_steps_as_torchrls_and_takes_the_fast_road_where_no_transform_hooks(
    extra, monkeypatch
):
    """The data modules build every transformed environment with compat.torchrl.transformed: the observation
    normaliser's chain on a real Gymnasium task, stepped through resets, gives what TorchRL's TransformedEnv gives,
    through the short step_and_maybe_reset and the short _step (no inverse pass); a transform that hooks after
    step_mdp keeps TorchRL's step_and_maybe_reset, and its hook runs; a transform with an inverse keeps TorchRL's
    _step, and its inverse runs."""
    from torchrl.envs import Compose, TransformedEnv

    from compat.torchrl import transformed
    from modules.normalization import ObservationNormalizer

    gym_env = pytest.importorskip("envs.gym.env", reason="the gym extra is not installed")
    normalizer = ObservationNormalizer((4,))
    normalizer.update(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)) * 3 + 1)  # not the identity
    hooked = extra == "hook"
    chain = [*normalizer.transforms(), *{None: [], "hook": [_HookAfterStepMdp()], "inverse": [_Inverse()]}[extra]]

    def environment(make: Any) -> TransformedEnv:
        base = gym_env.GymnasiumEnv(num_envs=3, env_id="CartPole-v1", seed=3)
        return make(base, Compose(*[t.clone() for t in chain]))

    fast, reference = environment(transformed), environment(TransformedEnv)
    if not hooked:  # TorchRL's road is refused on `fast`
        monkeypatch.setattr(fast, "_step_and_maybe_reset", lambda td: pytest.fail("the fast road was not taken"))
    if extra is None:  # and TorchRL's _step, which runs the chain's inverse
        monkeypatch.setattr(fast.transform, "inv", lambda td: pytest.fail("the short _step was not taken"))
    _HookAfterStepMdp.calls = _Inverse.calls = 0
    td_fast, td_reference = fast.reset(), reference.reset()
    # and TorchRL's reset road (maybe_reset through reset), whichever step_and_maybe_reset calls it
    monkeypatch.setattr(fast, "_reset_proc_data", lambda *args: pytest.fail("the short maybe_reset was not taken"))
    ended = False
    for step, action in enumerate(random_actions(fast, steps=60)):
        logits = torch.randn(3, 2)  # a policy's outputs: carried to the next step, zeroed in the rows that reset
        for td in (td_fast, td_reference):
            td["action"], td["logits"] = action.clone(), logits.clone()
        stepped_fast, td_fast = fast.step_and_maybe_reset(td_fast)
        stepped_reference, td_reference = EnvBase._step_and_maybe_reset(reference, td_reference)
        for mine, theirs in ((stepped_fast, stepped_reference), (td_fast, td_reference)):
            assert set(mine.keys(True, True)) == set(theirs.keys(True, True)), step
            for key in theirs.keys(True, True):
                assert torch.equal(mine[key], theirs[key]), (step, key)
        ended |= bool(stepped_fast["next", "done"].any())
    assert ended  # resets were crossed
    assert not torch.equal(td_fast["observation"], td_fast["raw_observation"])  # normalised
    assert _HookAfterStepMdp.calls == (2 * 60 if hooked else 0)  # both environments' hooks, at every step
    assert _Inverse.calls == (2 * 60 if extra == "inverse" else 0)  # both environments' inverses, at every step
    for each in (fast, reference):
        each.close()


class _NestedObservation(Transform):
    """A transform that adds a nested observation entry, at steps and resets."""

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set(("extra", "x"), tensordict.get("observation")[..., :1] * 2)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        from torchrl.data import Composite, Unbounded

        shape = observation_spec.shape
        observation_spec["extra"] = Composite(x=Unbounded(shape=(*shape, 1)), shape=shape)
        return observation_spec


def test_a_transformed_environment_with_a_nested_entry_resets_as_torchrls():
    """A carried sub-tensordict is merged by TorchRL's own reset (the short merge takes tensors only), with the same
    result through resets."""
    from torchrl.envs import Compose, TransformedEnv

    from compat.torchrl import transformed

    gym_env = pytest.importorskip("envs.gym.env", reason="the gym extra is not installed")

    def environment(make: Any) -> TransformedEnv:
        return make(gym_env.GymnasiumEnv(num_envs=3, env_id="CartPole-v1", seed=3), Compose(_NestedObservation()))

    fast, reference = environment(transformed), environment(TransformedEnv)
    td_fast, td_reference = fast.reset(), reference.reset()
    ended = False
    for step, action in enumerate(random_actions(fast, steps=60)):
        td_fast["action"], td_reference["action"] = action.clone(), action.clone()
        stepped_fast, td_fast = fast.step_and_maybe_reset(td_fast)
        _, td_reference = EnvBase._step_and_maybe_reset(reference, td_reference)
        assert set(td_fast.keys(True, True)) == set(td_reference.keys(True, True)), step
        for key in td_reference.keys(True, True):
            assert torch.equal(td_fast[key], td_reference[key]), (step, key)
        ended |= bool(stepped_fast["next", "done"].any())
    assert ended and ("extra", "x") in td_fast.keys(True, True)
    for each in (fast, reference):
        each.close()


@pytest.mark.parametrize("rows", [[True, False, True], [True, True, True]], ids=["some rows", "every row"])
def test_the_short_merge_after_a_reset_is_torchrls(rows):
    """compat.torchrl's merge of a reset into the next step's input gives what TorchRL's _update_during_reset gives:
    the reset's entries in the rows that reset, zeros there for entries the reset lacks, a reset-only entry zero in
    the other rows, the input's own tensors left as they were."""
    from tensordict import TensorDict
    from torchrl.envs.utils import _update_during_reset

    from compat.torchrl import _merged_after_reset

    flags = torch.tensor(rows).unsqueeze(-1)
    inputs = TensorDict(
        {"observation": torch.randn(3, 4), "done": flags.clone(), "logits": torch.randn(3, 2)}, batch_size=[3]
    )
    reset = TensorDict(
        {"observation": torch.randn(3, 4), "done": torch.zeros(3, 1, dtype=torch.bool), "step_count": torch.ones(3, 1)},
        batch_size=[3],
    )
    before, own_observation = inputs.clone(), inputs["observation"]
    theirs = _update_during_reset(reset.clone(), inputs.clone().set("_reset", flags.clone()), ["_reset"])
    mine = _merged_after_reset(inputs, reset.clone(), flags.clone())
    entries = {"observation", "done", "logits", "step_count"}
    assert set(mine.keys()) == set(theirs.keys()) == entries
    for key in entries:
        assert torch.equal(mine[key], theirs[key]), key
    assert torch.equal(own_observation, before["observation"])  # new tensors: the last step's "next" is untouched
    if not all(rows):
        assert torch.equal(mine["logits"][1], before["logits"][1]) and not mine["logits"][0].any()
        assert mine["step_count"][1].item() == 0


def test_the_fast_step_leaves_a_preset_next_to_torchrl():
    env = build(SnakeEnv)
    td = env.reset()
    td["action"] = env.action_spec.rand()
    td["next", "extra"] = torch.full((NUM_ENVS, 1), 7.0)  # TorchRL's step keeps a preset entry it does not compute
    stepped, _ = env.step_and_maybe_reset(td)
    assert torch.equal(stepped["next", "extra"], torch.full((NUM_ENVS, 1), 7.0))
    assert set(stepped["next"].keys()) > {"extra", "observation", "reward"}
    env.close()


@pytest.mark.parametrize("cls", ENVIRONMENTS)
def test_state_dict_continues_exactly(cls):
    if not cls.exact_state:  # declared by the class, with its reason (the family's own tests check what it restores)
        assert cls.inexact_state_reason, f"{cls.__name__} declares exact_state = False without inexact_state_reason"
        pytest.skip(f"{cls.__name__}: {cls.inexact_state_reason}")
    env = build(cls)
    actions = random_actions(env, steps=2 * STEPS)
    _, td = play(env, actions[: STEPS // 2])
    state = env.state_dict()
    restored = build(cls, seed=99)  # another seed: the streams must come from the state too
    restored.load_state_dict(state)
    continued, _ = play(env, actions[STEPS // 2 :], td.clone())
    assert_episodes_ended(cls, continued)
    assert_same_episodes(continued, play(restored, actions[STEPS // 2 :], td.clone())[0])
    for each in (env, restored):
        each.close()


def test_the_data_module_refuses_an_environment_outside_the_contract():
    from torchrl.envs import StepCounter, TransformedEnv

    from datamodules.replay import ReplayDataModule
    from envs.testing.chain import ChainEnv

    def wrapped(**kwargs: Any) -> TransformedEnv:
        return TransformedEnv(ChainEnv(**kwargs), StepCounter())

    with pytest.raises(ValueError, match=r"^data.env: torchrl\..*TransformedEnv is not a .*BatchedEnv"):
        ReplayDataModule(wrapped)
