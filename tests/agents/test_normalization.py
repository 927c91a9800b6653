"""Observation normalisation: the running statistics by hand, one set of them in every environment the policy acts in
(in process, behind environment workers, in collector workers, evaluation, every DDP rank), frozen outside the
learner's update, and carried by checkpoints so that a resumed run ends where an uninterrupted one does."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torchrl.data import Composite, Unbounded

from datamodules.collection import CollectorWorkers, EnvWorkers, InProcess
from datamodules.evaluation import EvaluationOptions
from datamodules.rollout import RolloutDataModule
from envs.racing.env import RacingEnv
from modules.networks import NetworkOptions
from modules.normalization import RAW_OBSERVATION, ObservationNormalizer, RewardScaler, SharedObservationNorm
from modules.ppo import PPO, NormalizationOptions
from tests.agents.test_ppo_continuous import racing_ppo_config
from tests.app_process import run_app_process
from tests.helpers import RESEEDED, ROOT, fit, weights, write_config


def test_statistics_are_the_mean_and_variance_of_every_observation_so_far():
    normalizer = ObservationNormalizer((3,), clip=2.0)
    torch.manual_seed(0)
    rollouts = [
        torch.randn(4, 5, 3) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([0.0, 50.0, -3.0]) for _ in range(3)
    ]
    for rollout in rollouts:
        normalizer.update(rollout)
    seen = torch.cat([rollout.reshape(-1, 3) for rollout in rollouts]).double()
    assert normalizer.count.item() == 60
    torch.testing.assert_close(normalizer.mean, seen.mean(0))
    torch.testing.assert_close(normalizer.var, seen.var(0, unbiased=False))
    # The transform's loc and scale, and what it computes: (x − mean) / √(var + ε), clipped.
    torch.testing.assert_close(normalizer.norm.loc, seen.mean(0).float())
    torch.testing.assert_close(normalizer.norm.scale, (seen.var(0, unbiased=False) + 1e-8).sqrt().float())
    x = torch.tensor([[0.0, 50.0, -3.0], [5.0, 80.0, -2.0]])
    expected = ((x - seen.mean(0).float()) / (seen.var(0, unbiased=False) + 1e-8).sqrt().float()).clamp(-2, 2)
    torch.testing.assert_close(normalizer(x), expected)


def test_an_option_that_cannot_apply_is_one_line_naming_the_flag():
    from torchrl.data import Binary, Categorical

    uint8 = {"observation_spec": Composite(observation=Binary(n=2, shape=(2,), dtype=torch.uint8))}
    with pytest.raises(ValueError, match=r"^model.normalize.observations standardises float observations; "):
        PPO(**uint8, action_spec=Categorical(2), normalize=NormalizationOptions(observations=True))
    floats = {"observation_spec": Composite(observation=Unbounded(shape=(3,))), "action_spec": Categorical(2)}
    with pytest.raises(ValueError, match=r"^model.normalize.observation_clip must be > 0, got 0"):
        PPO(**floats, normalize=NormalizationOptions(observations=True, observation_clip=0))


def rollout_module(collection) -> tuple[RolloutDataModule, PPO]:
    """PPO with normalisation on the racing cars, 4 of them, rollouts of 8 steps, ready to collect."""
    short = partial(RacingEnv, max_steps=20)  # evaluation episodes of 20 steps
    data = RolloutDataModule(
        short,
        num_envs=4,
        collect_steps=8,
        minibatch_size=32,
        collection=collection,
        evaluation=EvaluationOptions(episodes=2),
    )
    torch.manual_seed(0)
    network, normalize = NetworkOptions(hidden_sizes=(8,)), NormalizationOptions(observations=True)
    model = PPO(data.observation_spec, data.action_spec, network=network, normalize=normalize)
    data.setup("fit")
    data.use_env_transform(model.env_transform())
    data.connect(model.policy(), model.postprocess, model.batch_keys())
    data._build_collector()
    return data, model


@pytest.mark.slow
@pytest.mark.parametrize("collection", [InProcess(), EnvWorkers(workers=2), CollectorWorkers(workers=2)], ids=repr)
def test_every_environment_normalises_with_the_learners_statistics(tmp_path, monkeypatch, collection):
    # Each rollout is normalised with the statistics the learner held when it asked for it (they include every rollout
    # before), wherever the environments step; evaluation uses them as they are and leaves them alone.
    monkeypatch.chdir(tmp_path)  # collector workers' logs
    data, model = rollout_module(collection)
    normalizer = model.observation_normalizer
    try:
        for rollout in range(3):
            loc, scale = normalizer.norm.loc.clone(), normalizer.norm.scale.clone()
            batch = data.collect()  # and postprocess: GAE, then this rollout into the statistics
            expected = ((batch[RAW_OBSERVATION] - loc) / scale).clamp(-10, 10)
            # The first step's observation was carried from the rollout before, normalised with the statistics then.
            torch.testing.assert_close(batch["observation"][..., 1:, :], expected[..., 1:, :], rtol=0, atol=0)
            assert normalizer.count.item() == 32 * (rollout + 1)
        assert not torch.equal(normalizer.norm.loc, torch.zeros(8))
        count, mean = normalizer.count.clone(), normalizer.mean.clone()
        data.evaluate(model.greedy_policy(), 2)
        assert torch.equal(normalizer.count, count) and torch.equal(normalizer.mean, mean)
        evaluation_norm = next(t for t in data._eval_env.transform if isinstance(t, SharedObservationNorm))
        assert evaluation_norm.loc.data_ptr() == normalizer.norm.loc.data_ptr()  # the same tensor, not a copy
    finally:
        data.teardown("fit")


def test_the_normalising_transform_is_torchrls_chain_of_three_in_one():
    """SharedObservationNorm keeps the raw observation, normalises and clips in one transform: the entries, values and
    specs of TorchRL's RenameTransform(create_copy=True), ObservationNorm and ClipTransform one after the other, on a
    real Gymnasium task with bounded observations (ObservationNorm maps their bounds), stepped through resets."""
    from torchrl.envs import ClipTransform, Compose, ObservationNorm, RenameTransform, TransformedEnv

    gym_env = pytest.importorskip("envs.gym.env", reason="the gym extra is not installed")
    normalizer = ObservationNormalizer((6,), clip=1.5)  # a clip the normalised values cross
    normalizer.update(torch.randn(64, 6, generator=torch.Generator().manual_seed(0)) * 0.3)
    loc, scale = normalizer.norm.loc, normalizer.norm.scale
    chain = [
        RenameTransform(["observation"], [RAW_OBSERVATION], create_copy=True),
        ObservationNorm(loc=loc, scale=scale, in_keys=["observation"], standard_normal=True),
        ClipTransform(in_keys=["observation"], low=-1.5, high=1.5),
    ]
    ours, theirs = (
        TransformedEnv(gym_env.GymnasiumEnv(3, "Acrobot-v1", {"max_episode_steps": 15}, seed=3), Compose(*transforms))
        for transforms in ([t.clone() for t in normalizer.transforms()], chain)
    )
    assert ours.observation_spec == theirs.observation_spec
    assert ours.observation_spec["observation"] != ours.base_env.observation_spec["observation"]  # bounds mapped
    td_ours, td_theirs = ours.reset(), theirs.reset()
    clipped = ended = False
    for step in range(40):
        action = ours.action_spec.rand()
        td_ours["action"], td_theirs["action"] = action, action.clone()
        stepped_ours, td_ours = ours.step_and_maybe_reset(td_ours)
        stepped_theirs, td_theirs = theirs.step_and_maybe_reset(td_theirs)
        for mine, reference in ((stepped_ours, stepped_theirs), (td_ours, td_theirs)):
            assert list(mine.keys(True, True)) == list(reference.keys(True, True)), step
            for key in reference.keys(True, True):
                assert torch.equal(mine[key], reference[key]), (step, key)
        clipped |= bool((stepped_ours["next", "observation"].abs() == 1.5).any())
        ended |= bool(stepped_ours["next", "done"].any())
    assert clipped and ended  # the clip and the resets were crossed


class RecordStatistics(pl.Callback):
    """The normaliser's statistics when training starts (a resumed run's: the checkpoint's)."""

    def on_train_start(self, trainer, pl_module):
        self.state = {key: value.clone() for key, value in pl_module.observation_normalizer.state_dict().items()}


def resume_config(root, collection: str) -> dict:
    config = racing_ppo_config(root, steps=18, normalize={"observations": True})
    if collection == "collector_workers":
        workers = {"class_path": "datamodules.collection.CollectorWorkers", "init_args": {"workers": 2}}
        config["data"]["init_args"]["collection"] = workers
    return config


@pytest.mark.slow
@pytest.mark.parametrize("collection", ["in_process", "collector_workers"])
def test_resumed_run_continues_the_statistics_and_ends_with_identical_weights(tmp_path, collection):
    # 4 cars x 16 steps = 64 frames per rollout, 2 epochs of 2 minibatches: 4 updates per rollout; stopping at update
    # 9 leaves the checkpoint in the middle of the third rollout, whose frames are already in the statistics.
    half = 9
    full = fit(write_config(resume_config(tmp_path / "full", collection), tmp_path / "full.yaml"))
    interrupted = write_config(resume_config(tmp_path / "half", collection), tmp_path / "half.yaml")
    fit(interrupted, "--trainer.max_steps", str(half))
    first_half = weights(tmp_path / "half/checkpoints/last.ckpt")
    assert first_half["observation_normalizer.count"].item() == 3 * 64  # every collected frame, once
    record = "--trainer.callbacks+=tests.agents.test_normalization.RecordStatistics"
    cli = fit(interrupted, "--ckpt_path", "last", *RESEEDED, record)
    assert cli.trainer.global_step == full.trainer.global_step == 18
    # The resumed run started from the checkpoint's statistics...
    started = next(callback for callback in cli.trainer.callbacks if isinstance(callback, RecordStatistics)).state
    for key, value in started.items():
        assert torch.equal(value, first_half[f"observation_normalizer.{key}"]), key
    # ...and ended with the uninterrupted run's statistics and weights.
    uninterrupted, resumed = (
        weights(tmp_path / "full/checkpoints/last.ckpt"),
        weights(tmp_path / "half/checkpoints/last.ckpt"),
    )
    assert uninterrupted.keys() == resumed.keys()
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], resumed[key]), key
    assert resumed["observation_normalizer.count"].item() == 5 * 64
    assert not torch.equal(first_half["observation_normalizer.mean"], resumed["observation_normalizer.mean"])


class DumpStatistics(pl.Callback):
    """Each DDP rank writes its normaliser's statistics and frame count at the end of fit."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)

    def on_train_end(self, trainer, pl_module):
        state = {key: value.clone() for key, value in pl_module.observation_normalizer.state_dict().items()}
        torch.save(
            {"statistics": state, "frames": trainer.datamodule.frames}, self.dirpath / f"rank{trainer.global_rank}.pt"
        )


@pytest.mark.slow
def test_ddp_ranks_normalise_with_statistics_of_all_their_rollouts(tmp_path):
    # Each rank collects its own rollouts; the statistics merge every rank's, so both ranks hold the same numbers.
    config = racing_ppo_config(tmp_path, steps=8, normalize={"observations": True})
    config["trainer"]["callbacks"].append(
        {"class_path": "tests.agents.test_normalization.DumpStatistics", "init_args": {"dirpath": str(tmp_path)}}
    )
    path = write_config(config, tmp_path / "ddp.yaml")
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    result = run_app_process("fit", "--config", str(path), *ddp, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1))
    assert rank0["frames"] == rank1["frames"] == 2 * 64
    assert rank0["statistics"]["count"].item() == 2 * 2 * 64  # both ranks' rollouts
    for key, value in rank0["statistics"].items():
        assert torch.equal(value, rank1["statistics"][key]), key


# ------------------------------------------------------------------------------------------------ reward scaling
def test_rewards_are_scaled_by_the_std_of_the_discounted_return_carried_across_rollouts_and_episodes():
    scaler = RewardScaler(gamma=0.5, clip=10.0, epsilon=0.0)
    reward = torch.tensor([[1.0, 2.0], [4.0, 0.0]]).unsqueeze(-1)  # two copies, two steps
    done = torch.tensor([[True, False], [False, False]]).unsqueeze(-1)
    scaler.scale_(reward, done)
    # Copy 0: returns 1, then 2 (its episode ended after step 0); copy 1: 4, then 0.5 · 4 + 0 = 2.
    returns = torch.tensor([1.0, 2.0, 4.0, 2.0], dtype=torch.float64)
    assert scaler.var.item() == pytest.approx(returns.var(unbiased=False).item())
    std = returns.var(unbiased=False).sqrt().item()
    assert reward.flatten().tolist() == pytest.approx([1 / std, 2 / std, 4 / std, 0.0])
    assert scaler.returns.tolist() == [2.0, 2.0]
    # The next rollout carries each copy's return: copy 0 continues from 2, copy 1 from 2.
    second = torch.tensor([[1.0], [-1.0]]).unsqueeze(-1)
    scaler.scale_(second, torch.zeros(2, 1, 1, dtype=torch.bool))
    assert scaler.returns.tolist() == [2.0, 0.0] and scaler.count.item() == 6
    merged = torch.cat([returns, torch.tensor([2.0, 0.0], dtype=torch.float64)])
    assert scaler.var.item() == pytest.approx(merged.var(unbiased=False).item())
    # A large reward is clipped (it raises the variance too: about 3 standard deviations here, above a clip of 2); a
    # checkpoint restores the per-copy returns into a fresh scaler.
    scaler.clip = 2.0
    big = torch.tensor([[1e6], [0.0]]).unsqueeze(-1)
    scaler.scale_(big, torch.zeros(2, 1, 1, dtype=torch.bool))
    assert big[0].item() == 2.0
    restored = RewardScaler(gamma=0.5)
    restored.load_state_dict(scaler.state_dict())
    assert torch.equal(restored.returns, scaler.returns) and restored.var.item() == scaler.var.item()


def test_the_statistics_on_the_host_are_torchs_to_the_bit_where_they_meet_the_learner(monkeypatch):
    """On the CPU the statistics' arithmetic runs in NumPy on views of the learner's buffers (modules/normalization.py,
    ``on_host``); elsewhere (an accelerator, DDP) in torch. Over rollouts with episode ends, both give the same
    scaled rewards and the same float32 loc and scale that the environments normalise with, to the bit, and float64
    statistics equal up to the order of a sum's terms; the buffers are updated in place (a clone's transform shares
    them)."""
    from modules import normalization

    def run(host: bool) -> tuple[list[torch.Tensor], RewardScaler, ObservationNormalizer]:
        monkeypatch.setattr(normalization, "on_host", lambda *tensors: host)
        generator = torch.Generator().manual_seed(3)
        scaler, normalizer = RewardScaler(gamma=0.99), ObservationNormalizer((3,))
        loc, scale = normalizer.norm.loc, normalizer.norm.scale
        scaled = []
        for _ in range(50):
            reward = torch.randn(16, 5, 1, generator=generator) * 20 + 3
            done = torch.rand(16, 5, 1, generator=generator) < 0.1
            scaler.scale_(reward, done)
            normalizer.update(torch.randn(16, 5, 3, generator=generator) * 4 - 1)
            scaled.append(reward)
            assert normalizer.norm.loc is loc and normalizer.norm.scale is scale  # in place
        return scaled, scaler, normalizer

    (host_rewards, host_scaler, host_norm), (torch_rewards, torch_scaler, torch_norm) = run(True), run(False)
    for ours, theirs in zip(host_rewards, torch_rewards, strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(host_norm.norm.loc, torch_norm.norm.loc)
    assert torch.equal(host_norm.norm.scale, torch_norm.norm.scale)
    assert torch.equal(host_scaler.returns, torch_scaler.returns)
    for ours, theirs in ((host_scaler, torch_scaler), (host_norm, torch_norm)):
        for name in ("count", "mean", "var"):
            assert torch.allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-12, atol=0), name


def test_the_statistics_run_in_torch_on_an_accelerator_or_with_ddp():
    from modules.normalization import on_host

    assert on_host(torch.zeros(2), torch.zeros(()))
    assert not on_host(torch.zeros(2, device="meta"))
    assert not on_host(torch.zeros(2, requires_grad=True))
