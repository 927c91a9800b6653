"""The off-policy path: warm-up, the replay ratio, batch shapes and the buffer's device."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
import torch
from torchrl.collectors import RandomPolicy
from torchrl.envs import ExplorationType, MultiStepTransform, exploration_type, set_exploration_type

from app.cli import build
from datamodules.delivery import _start_background_thread
from datamodules.rollout import RolloutDataModule
from envs.testing.chain import ChainEnv
from tests.helpers import PREFETCH, ROOT, chain_config, fit, write_config


@pytest.mark.slow
@pytest.mark.parametrize(
    ("frames_per_update", "updates", "expected_frames"), [(4, 20, 136), (0.5, 40, 80), (3, 10, 88)]
)
def test_frames_per_update_sets_the_replay_ratio(tmp_path, frames_per_update, updates, expected_frames):
    # 8 envs → 8 frames per collect; warm-up 64 frames; the collect that reaches frame 64 earns credit already.
    # Each collect earns 8 / frames_per_update updates, so U updates take ceil(U * frames_per_update / 8) collects
    # from frame 56 on:  4 → 20 updates: 10 collects → 136 frames;  0.5 → 40 updates: 3 collects → 80 frames;
    # 3 → 10 updates: ceil(3.75) = 4 collects → 88 frames (the fractional credit carries over).
    config = chain_config("dqn", tmp_path, frames_per_update=frames_per_update, warmup_frames=64)
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", str(updates))
    data = cli.datamodule
    assert data.frames == expected_frames
    assert data.samples == updates * 32
    earned = (data.frames - 56) / frames_per_update  # frames from the collect that completed the warm-up on
    assert earned - data.update_credit == pytest.approx(updates)


@pytest.mark.slow
def test_batches_are_whole_tensordicts_from_the_buffer_device(tmp_path):
    cli = fit(write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml"), "--trainer.max_steps", "2")
    batch = cli.datamodule.buffer.sample()
    assert batch.batch_size == (32,)
    assert {"observation", "action", ("next", "reward"), ("next", "observation")} <= set(batch.keys(True))
    assert "collector" not in batch.keys()  # noqa: SIM118
    assert batch.device == cli.datamodule.device


def test_a_stored_batch_has_one_order_of_entries_whatever_order_the_loss_names_them():
    # A loss's `in_keys` come in the order of a set, which changes with each process's string hashing; a compiled
    # loss's graph inputs follow the batch's order, and its on-disk cache key with them.
    orders = []
    for reverse in (False, True):
        model, data = build([str(ROOT / "configs/snake_dqn.yaml")], ["--data.init_args.num_envs", "4"])
        data.setup("fit")
        keys = model.batch_keys()
        data.connect(model.policy(), None, keys[::-1] if reverse else keys, model.store_transform())
        data._build_collector()
        for _ in range(4):
            data.store(data.collect())
        orders.append(list(data.buffer.sample(8).keys(True, True)))
    assert orders[0] == orders[1]
    assert {"observation", "action", ("next", "reward")} <= set(orders[0])


def test_n_step_transitions_are_stored_as_summed_by_hand():
    # Real Snake boards under the model's exploring policy at ε = 1, i.e. random play (deaths and food in many
    # windows), through the data module's own write path; γ 0.5 so that every term of a sum shows.
    n, gamma, envs, calls = 3, 0.5, 4, 120
    overrides = ["--model.init_args.n_steps", str(n), "--model.init_args.gamma", str(gamma)]
    overrides += ["--data.init_args.num_envs", str(envs), "--data.init_args.buffer_size", "10000"]
    model, data = build([str(ROOT / "configs/snake_dqn.yaml")], overrides)
    data.setup("fit")
    data.connect(model.policy(), None, model.batch_keys(), model.store_transform())
    data._build_collector()
    collected = []
    for _ in range(calls):
        batch = data.collect()
        collected.append(batch.clone())
        data.store(batch)
    raw = torch.cat(collected, 1)  # [envs, calls]
    stored = data.buffer.storage[: len(data.buffer)]
    assert len(data.buffer) == envs * (calls - n)  # each call completes one window per board, after the first n
    reward, done = raw["next", "reward"].squeeze(-1), raw["next", "done"].squeeze(-1)
    assert done.any() and (reward > 0).any()
    for row in range(len(stored)):
        t, env = divmod(row, envs)
        k = 0
        while not done[env, t + k] and k < n - 1:
            k += 1
        expected = sum(gamma**i * reward[env, t + i] for i in range(k + 1))
        sample = stored[row]
        assert sample["next", "reward"].item() == pytest.approx(expected.item())
        assert sample["steps_to_next_obs"].item() == k + 1
        assert torch.equal(sample["observation"], raw["observation"][env, t])
        assert torch.equal(sample["next", "observation"], raw["next", "observation"][env, t + k])
        # The end flags of the step the sum stops at: a window that ends the episode does not bootstrap.
        assert sample["next", "terminated"].item() == raw["next", "terminated"][env, t + k].item()
    # ...and DQN's loss discounts the bootstrap by γ^(steps): its TD error on a stored batch is the hand-made one.
    batch = stored[:64]
    loss = model.loss_module(batch.clone())
    with torch.no_grad():
        q = model.q_network(batch["observation"]).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
        next_q = model.q_network(batch["next", "observation"])  # target = online at initialisation
        best = next_q.argmax(-1, keepdim=True) if model.hparams.double_dqn else None
        next_value = next_q.gather(-1, best).squeeze(-1) if best is not None else next_q.max(-1).values
        alive = ~batch["next", "terminated"].squeeze(-1)
        target = batch["next", "reward"].squeeze(-1) + gamma ** batch["steps_to_next_obs"] * alive * next_value
    assert loss["loss"].item() == pytest.approx((q - target).pow(2).mean().item(), rel=1e-5)


def test_a_store_transform_is_refused_by_the_on_policy_data_module():
    data = RolloutDataModule(
        env=partial(ChainEnv, length=6, max_steps=30), num_envs=4, collect_steps=4, minibatch_size=8
    )
    with pytest.raises(ValueError, match="need a replay data module"):
        data.connect(RandomPolicy(data.action_spec), None, None, MultiStepTransform(3, 0.9))


@pytest.mark.slow
def test_a_compilation_elsewhere_in_the_process_does_not_derail_a_prefetch_round(tmp_path, monkeypatch):
    # While any thread compiles, torch.compiler.is_compiling() reads True in every thread (one process-wide flag), and
    # TorchRL's code consults it. A round being prepared in the prefetch thread meanwhile (the loss recompiles on its
    # second call, right when the first background round starts) must still write the replay buffer as usual and act
    # with its own exploration type, not the "deterministic" a TorchRL loss sets during its forward pass.
    config = chain_config("dqn", tmp_path, collection=PREFETCH)
    data = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "4").datamodule
    batch = data.buffer.sample(8)
    stored = len(data.buffer)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    with ThreadPoolExecutor(1, initializer=_start_background_thread, initargs=(1,)) as thread:
        thread.submit(data.buffer.extend, batch).result()
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            mode = thread.submit(exploration_type).result()
    monkeypatch.undo()
    assert len(data.buffer) == stored + 8
    assert data.buffer.sample(4).batch_size == (4,)
    assert mode is None  # TorchRL's default, which explores


@pytest.mark.parametrize(
    ("num_envs", "collect_steps", "collection"),
    [
        (1, 1, "InProcess"),
        (3, 2, "InProcess"),
        pytest.param(2, 1, "EnvWorkers", marks=pytest.mark.slow),
    ],
)
def test_a_warmup_in_long_rounds_plays_and_stores_what_its_rounds_do(num_envs, collect_steps, collection, monkeypatch):
    """The shipped Pendulum SAC config (its actor samples its actions from the global generator) with 700 warm-up
    frames: the first round's preparation collects the warm-up in one long round and then the round that ends it;
    against the same preparation in rounds of ``collect_steps``, the buffer holds the same transitions in the same
    slots, to the bit, the environments and the generator stand at the same place, and the same frames were counted."""
    from compat.torchrl import collector_carrier, storage_contents
    from datamodules.replay import ReplayDataModule

    def prepared(long_rounds: bool):
        if not long_rounds:
            monkeypatch.setattr(ReplayDataModule, "warmup_steps", lambda self, frames: 0)
        torch.manual_seed(0)
        flags = ["--data.init_args.num_envs", str(num_envs), "--data.init_args.collect_steps", str(collect_steps)]
        flags += ["--data.init_args.warmup_frames", "700", "--data.init_args.collection", collection]
        if collection == "EnvWorkers":
            flags += ["--data.init_args.collection.workers", str(num_envs)]
        model, data = build([str(ROOT / "configs/gym/pendulum_sac.yaml")], flags)
        data.setup("fit")
        data.connect(model.policy(), None, model.batch_keys())
        calls = []
        collect = type(data.collection).collect
        monkeypatch.setattr(
            type(data.collection), "collect", lambda self, steps=0: calls.append(steps) or collect(self, steps)
        )
        data._build_collector()
        try:
            round_ = data.prepare_round(0, 0.0, data.timer)
            stored = storage_contents(data.buffer.storage)[: len(data.buffer)].clone()
            carrier = collector_carrier(data.collector).clone()
            following = data.collect()  # where the environments stand: the next round from here
        finally:
            data.collection.teardown()
            monkeypatch.undo()
        return round_.frames, round_.credit, calls, stored, carrier, following, torch.get_rng_state()

    long, short = prepared(True), prepared(False)
    round_frames = num_envs * collect_steps
    assert long[0] == short[0] == -(-700 // round_frames) * round_frames and long[1] == short[1]
    assert long[2][0] == (-(-700 // round_frames) - 1) * collect_steps and long[2][1:] == [0, 0]  # then rounds as usual
    assert set(short[2]) == {0}
    for ours, theirs in zip(long[3:], short[3:], strict=True):
        if isinstance(ours, torch.Tensor):
            assert torch.equal(ours, theirs)
        else:
            assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
            for key in theirs.keys(True, True):
                assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize(
    ("config", "flags"),
    [
        ("configs/gym/pendulum_sac.yaml", []),  # one copy; the actor samples from the global generator
        ("configs/gym/cartpole_a2c.yaml", []),  # 8 copies x 5 steps of a categorical policy
        ("configs/snake_ppo.yaml", ["--data.init_args.num_envs", "64"]),  # a batched tensor environment
        pytest.param(  # agents, and the recurrent state and episode-start flags in the carrier
            "configs/metta_ppo.yaml",
            ["--data.init_args.collection", "InProcess", "--data.init_args.num_envs", "2"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_rounds_stepped_on_the_carrier_are_the_collectors_own(config, flags, monkeypatch):
    """Four rounds stepped on the collector's carrier, as every in-process round now is, against the same rounds from
    TorchRL's Collector itself: the same batches, to the bit, and the environments and the generator where its rounds
    leave them (a warm-up's longer rounds against these: the test above)."""
    import datamodules.collection as collection
    from compat.torchrl import collector_carrier, collector_counters

    def rounds(on_carrier: bool):
        if not on_carrier:
            monkeypatch.setattr(collection, "round_on_carrier", lambda collector, steps: None)
        torch.manual_seed(0)
        model, data = build([str(ROOT / config)], flags)
        data.use_env_transform(model.env_transform() if hasattr(model, "env_transform") else None)
        data.setup("fit")
        data.connect(model.policy(), None, model.batch_keys())
        data._build_collector()
        try:
            batches = [data.collect() for _ in range(4)]
            carrier = collector_carrier(data.collector).clone()
            collector_rounds = collector_counters(data.collector)[1]
        finally:
            data.collection.teardown()
            monkeypatch.undo()
        return batches, carrier, data.frames, torch.get_rng_state(), collector_rounds

    (ours, carrier, frames, generator, counted) = rounds(on_carrier=True)
    (theirs, their_carrier, their_frames, their_generator, their_counted) = rounds(on_carrier=False)
    assert their_counted - counted == 4  # which road each took: the collector counts the rounds it steps
    for batch, expected in zip([*ours, carrier], [*theirs, their_carrier], strict=True):
        assert set(batch.keys(True, True)) == set(expected.keys(True, True))
        for key in expected.keys(True, True):
            assert torch.equal(batch[key], expected[key]), key
    assert frames == their_frames and torch.equal(generator, their_generator)


@pytest.mark.parametrize(
    ("config", "flags", "rounds"),
    [
        # one copy, a frame a round after a warm-up of 100 in one long round; 256 slots, so the writes wrap around
        ("configs/gym/pendulum_sac.yaml", ["--data.init_args.buffer_size", "256"], 200),
        # 8 copies x 32 steps, 64 updates a round drawn in one call; the warm-up's rounds permuted into round order
        (
            "configs/gym/cartpole_dqn.yaml",
            ["--data.init_args.buffer_size", "1500", "--data.init_args.warmup_frames", "600"],
            6,
        ),
    ],
)
def test_replay_written_and_drawn_entry_by_entry_is_torchrls_own(config, flags, rounds, monkeypatch):
    """Rounds prepared with the replay buffer written and drawn entry by entry (``compat.torchrl.DirectReplay``), as
    every uniform replay now is, against the same rounds through TorchRL's ``extend`` and ``sample``: the same
    batches drawn, to the bit and in the same order of entries, the same buffer state (every slot, the writer's
    cursor and count, the storage's length) and the generator where TorchRL's calls leave it."""
    from compat.torchrl import DirectReplay

    def prepared(direct: bool):
        taken = {"extend": 0, "sample": 0}  # calls the direct path served
        extend, sample = DirectReplay.extend, DirectReplay.sample

        def counted_extend(self, batch):
            written = extend(self, batch)
            taken["extend"] += written
            return written

        def counted_sample(self, count, parts=1):
            drawn = sample(self, count, parts)
            taken["sample"] += drawn is not None
            return drawn

        monkeypatch.setattr(DirectReplay, "extend", counted_extend if direct else lambda self, batch: False)
        monkeypatch.setattr(DirectReplay, "sample", counted_sample if direct else lambda self, count, parts=1: None)
        torch.manual_seed(0)
        model, data = build([str(ROOT / config)], flags)
        data.setup("fit")
        data.connect(model.policy(), None, model.batch_keys())
        data._build_collector()
        try:
            frames, credit, batches = 0, 0.0, []
            for _ in range(rounds):
                round_ = data.prepare_round(frames, credit, data.timer)
                frames, credit = round_.frames, round_.credit - len(round_.batches)
                batches += round_.batches
            state = data.buffer.state_dict()
        finally:
            data.collection.teardown()
            monkeypatch.undo()
        return batches, state, torch.get_rng_state(), taken

    ours, their = prepared(direct=True), prepared(direct=False)
    assert ours[3]["extend"] >= rounds - 2 and ours[3]["sample"] >= rounds - 2  # the road each took
    assert len(ours[0]) == len(their[0]) > 0
    for batch, expected in zip(ours[0], their[0], strict=True):
        assert list(batch.keys(True, True)) == list(expected.keys(True, True))
        assert batch.batch_size == expected.batch_size and batch["next"].batch_size == expected["next"].batch_size
        for key in expected.keys(True, True):
            assert torch.equal(batch[key], expected[key]), key
    assert_same_state(ours[1], their[1])
    assert torch.equal(ours[2], their[2])


def assert_same_state(ours, theirs, where="state"):
    """Two state dicts equal entry by entry (tensors to the bit, tensordicts leaf by leaf)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), where
        for key in theirs:
            assert_same_state(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, torch.Tensor):
        assert torch.equal(ours, theirs), where
    elif hasattr(theirs, "keys") and hasattr(theirs, "batch_size"):  # a tensordict
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True)), where
        for key in theirs.keys(True, True):
            assert torch.equal(ours[key], theirs[key]), f"{where}.{key}"
    else:
        assert ours == theirs, where
