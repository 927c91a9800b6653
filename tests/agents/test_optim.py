"""The update's optimizer step (the fused kernels, modules/optim.py) and the learning-rate schedule in frames."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from modules.dqn import DQN
from modules.optim import FusedAdamStep, OptimizerOptions, TFLikeRMSprop
from tests.agents.test_dqn import SPECS
from tests.helpers import chain_config, fit, write_config


def two_copies() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    return net, copy.deepcopy(net)


def train(net: nn.Module, step, inputs: list[torch.Tensor]) -> None:
    for x in inputs:
        net(x).pow(2).sum().backward()
        step()


@pytest.mark.parametrize("max_grad_norm", [None, 0.05])
def test_fused_adam_step_is_clip_adam_step_and_zero_grad_bit_for_bit(max_grad_norm):
    ours, reference = two_copies()
    inputs = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(12)]
    step = FusedAdamStep(torch.optim.Adam(ours.parameters(), lr=1e-2, weight_decay=1e-3, fused=True), max_grad_norm)
    assert step.direct
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, weight_decay=1e-3, fused=True)

    def reference_step():
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), max_grad_norm)
        reference_optimizer.step()
        reference_optimizer.zero_grad(set_to_none=True)

    train(ours, step, inputs)
    train(reference, reference_step, inputs)
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b) and a.grad is None
    ours_state, reference_state = step.optimizer.state_dict()["state"], reference_optimizer.state_dict()["state"]
    for index, state in reference_state.items():
        for key, value in state.items():
            assert torch.equal(ours_state[index][key], value), key
    assert float(reference_state[0]["step"]) == len(inputs)


def test_fused_adam_step_continues_from_a_loaded_optimizer_state():
    # A resumed run loads the optimizer state (new tensors) before its first step: the step must use those.
    ours, reference = two_copies()
    inputs = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(10)]
    reference_step = FusedAdamStep(torch.optim.Adam(reference.parameters(), lr=1e-2, fused=True), 1.0)
    train(reference, reference_step, inputs)

    torch.manual_seed(0)
    first = copy.deepcopy(ours)
    first_step = FusedAdamStep(torch.optim.Adam(first.parameters(), lr=1e-2, fused=True), 1.0)
    train(first, first_step, inputs[:4])
    resumed_optimizer = torch.optim.Adam(ours.parameters(), lr=1e-2, fused=True)
    ours.load_state_dict(first.state_dict())
    resumed_optimizer.load_state_dict(first_step.optimizer.state_dict())
    train(ours, FusedAdamStep(resumed_optimizer, 1.0), inputs[4:])
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


def test_other_optimizers_and_missing_gradients_take_the_optimizers_own_step():
    ours, reference = two_copies()
    sgd = FusedAdamStep(torch.optim.SGD(ours.parameters(), lr=0.1), None)
    assert not sgd.direct
    reference_sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(8, 6)
    train(ours, sgd, [x])
    reference(x).pow(2).sum().backward()
    reference_sgd.step()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), reference.parameters(), strict=True))

    # Only the last layer gets a gradient: Adam's own step skips the others, as it always does.
    net, _ = two_copies()
    step = FusedAdamStep(torch.optim.Adam(net.parameters(), lr=1e-2, fused=True), 1.0)
    frozen = net[0].weight.detach().clone()
    net[2](torch.randn(8, 16)).sum().backward()
    step()
    assert torch.equal(net[0].weight, frozen) and all(p.grad is None for p in net.parameters())


def test_a_group_without_gradients_is_skipped_by_the_fused_step_as_adams_own_step_skips_it():
    # Two groups (an actor's and a critic's, as TD3 and CrossQ hold them): the critic trains every step, the actor
    # every other one. The fused kernels step the groups that have gradients, bit for bit what Adam's own step does,
    # and only the steps before every parameter has its state take the optimizer's own step.
    torch.manual_seed(0)
    actor, critic = nn.Linear(6, 2), nn.Linear(8, 1)
    ours, reference = (actor, critic), copy.deepcopy((actor, critic))

    def optimizer(pair):
        groups = [{"params": list(pair[0].parameters()), "lr": 1e-2}, {"params": list(pair[1].parameters())}]
        return torch.optim.Adam(groups, lr=3e-3, fused=True)

    step, reference_optimizer = FusedAdamStep(optimizer(ours), 0.5), optimizer(reference)
    own_steps = 0
    own_step = step.optimizer.step

    def counted_step(*args, **kwargs):
        nonlocal own_steps
        own_steps += 1
        return own_step(*args, **kwargs)

    step.optimizer.step = counted_step
    for index in range(9):
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(index))
        for (net_actor, net_critic), stepper in ((ours, step), (reference, None)):
            action = net_actor(x)
            if index % 2 == 0:  # the critic's step alone: the actor's output held fixed
                action = action.detach()
            loss = net_critic(torch.cat([x, action], -1)).pow(2).mean()
            loss.backward()
            if stepper is not None:
                stepper()
            else:
                torch.nn.utils.clip_grad_norm_([*net_actor.parameters(), *net_critic.parameters()], 0.5)
                reference_optimizer.step()
                reference_optimizer.zero_grad(set_to_none=True)
    for a, b in zip(
        [*ours[0].parameters(), *ours[1].parameters()],
        [*reference[0].parameters(), *reference[1].parameters()],
        strict=True,
    ):
        assert torch.equal(a, b)
    states = step.optimizer.state_dict()["state"], reference_optimizer.state_dict()["state"]
    steps = [float(states[0][index]["step"]) for index in range(4)]
    assert steps == [4, 4, 9, 9]  # the actor (parameters 0 and 1) stepped 4 times of 9
    for index, state in states[1].items():
        assert all(torch.equal(states[0][index][key], value) for key, value in state.items())
    assert own_steps == 2  # the first (the critic's state) and the second (the actor's): then the fused kernels


def test_learning_rate_follows_a_cosine_in_frames_to_lr_end():
    options = OptimizerOptions(lr=1e-3, lr_end=1e-4, lr_frames=1000)
    assert options.learning_rate(0) == pytest.approx(1e-3)
    assert options.learning_rate(500) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert options.learning_rate(250) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert options.learning_rate(1000) == options.learning_rate(10**9) == pytest.approx(1e-4)
    assert OptimizerOptions(lr=1e-3).learning_rate(10**9) == 1e-3  # no lr_end: constant


def test_learning_rate_falls_linearly_with_lr_decay_linear_and_restarts_as_the_cosine_does():
    options = OptimizerOptions(lr=1e-3, lr_end=0.0, lr_frames=1000, lr_decay="linear")  # the RL Zoo's lin_1e-3
    assert [options.learning_rate(frames) for frames in (0, 250, 500, 1000, 10**9)] == pytest.approx(
        [1e-3, 0.75e-3, 0.5e-3, 0.0, 0.0]
    )
    restarting = OptimizerOptions(lr=1e-3, lr_end=0.0, lr_frames=1000, lr_restart_mult=2.0, lr_decay="linear")
    assert [restarting.learning_rate(frames) for frames in (999, 1000, 2000, 3000)] == pytest.approx(
        [1e-6, 1e-3, 0.5e-3, 1e-3]
    )


def test_bad_learning_rate_schedule_names_the_flag():
    with pytest.raises(ValueError, match="model.optimizer.lr_end must be in"):
        DQN(**SPECS, optimizer=OptimizerOptions(lr=1e-3, lr_end=2e-3))
    with pytest.raises(ValueError, match="model.optimizer.lr_frames must be >= 1"):
        OptimizerOptions(lr_end=0.0, lr_frames=0)
    with pytest.raises(ValueError, match="^model.optimizer.lr_decay must be one of cosine, linear, got 'step'$"):
        OptimizerOptions(lr_end=0.0, lr_decay="step")


@pytest.mark.slow
def test_training_sets_and_logs_the_scheduled_learning_rate(tmp_path):
    config = chain_config("dqn", tmp_path)
    config["model"]["init_args"].update(optimizer={"lr": 1e-3, "lr_end": 1e-5, "lr_frames": 600})
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path)}}
    config["trainer"]["logger"] = logger
    cli = fit(
        write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "60", "--trainer.log_every_n_steps", "10"
    )
    # 8 frames per collection earn 4 updates: the last collection came before the 60th update set its rate.
    assert cli.model.optimizers().param_groups[0]["lr"] == pytest.approx(
        cli.model.optim.learning_rate(cli.datamodule.frames)
    )
    assert 1e-5 < float(cli.trainer.callback_metrics["train/lr"]) < 1e-3


def test_adams_eps_reaches_the_fused_step_bit_for_bit():
    # Stable-Baselines3's PPO uses ε = 1e-5: the options' optimizer carries it and the direct fused step uses it.
    ours, reference = two_copies()
    inputs = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    optimizer = OptimizerOptions(lr=1e-2, eps=1e-5).build([{"params": list(ours.parameters())}])
    assert optimizer.param_groups[0]["eps"] == 1e-5
    step = FusedAdamStep(optimizer, None)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5, fused=True)

    def reference_step():
        reference_optimizer.step()
        reference_optimizer.zero_grad(set_to_none=True)

    train(ours, step, inputs)
    train(reference, reference_step, inputs)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), reference.parameters(), strict=True))
    with pytest.raises(ValueError, match="^model.optimizer.eps must be > 0, got 0.0$"):
        OptimizerOptions(eps=0.0)


def test_rmsprop_tf_steps_as_stable_baselines3s_rmsprop_tf_like_bit_for_bit():
    """``algorithm: rmsprop_tf`` (the RL Zoo's Atari A2C: RMSpropTFLike, ε 1e-5) against Stable-Baselines3's own, step
    for step with weight decay; PyTorch's RMSprop moves the same weights elsewhere (its ε outside the root, its
    average from 0)."""
    reference_class = pytest.importorskip("stable_baselines3.common.sb2_compat.rmsprop_tf_like").RMSpropTFLike
    ours, reference = two_copies()
    pytorchs = copy.deepcopy(ours)
    options = OptimizerOptions(algorithm="rmsprop_tf", lr=7e-4, eps=1e-5, weight_decay=1e-3)
    optimizer = options.build([{"params": list(ours.parameters())}])
    assert type(optimizer) is TFLikeRMSprop
    theirs = reference_class(reference.parameters(), lr=7e-4, eps=1e-5, weight_decay=1e-3)
    pytorch = torch.optim.RMSprop(pytorchs.parameters(), lr=7e-4, eps=1e-5, weight_decay=1e-3)
    inputs = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(12)]
    for net, step in ((ours, optimizer), (reference, theirs), (pytorchs, pytorch)):
        for x in inputs:
            net(x).pow(2).sum().backward()
            step.step()
            step.zero_grad(set_to_none=True)
    for mine, its, torchs in zip(ours.parameters(), reference.parameters(), pytorchs.parameters(), strict=True):
        assert torch.equal(mine, its) and not torch.allclose(mine, torchs)
    # the state a checkpoint holds (a copy, as one read from disk), loaded into a fresh optimizer, continues the same
    resumed = copy.deepcopy(ours)
    again = options.build([{"params": list(resumed.parameters())}])
    again.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for net, step in ((ours, optimizer), (resumed, again)):
        net(inputs[0]).pow(2).sum().backward()
        step.step()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), resumed.parameters(), strict=True))
