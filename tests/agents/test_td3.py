"""TD3 on Pendulum as users run it (the Zoo's mapped config, its logger and run folder): delayed actor and target
updates, the uniform warm-up, the bare reference update's loss, exact resume, and the errors it gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchrl.data import Bounded, Composite, Unbounded

from app.cli import build, main
from callbacks.bare_updates import as_replay_sample, bare_update, batch_pool
from modules.td3 import TD3
from tests.helpers import ROOT, AfterUpdate, fit, resumed_on_the_racing_car, saved_replay

CONFIG = ROOT / "configs/gym/pendulum_td3.yaml"
#: Small networks and batches, a short warm-up, evaluation off: seconds, not the Zoo's minutes.
NETS = (
    *("--model.init_args.actor.hidden_sizes", "[32, 32]", "--model.init_args.critics.hidden_sizes", "[32, 32]"),
    *("--data.init_args.batch_size", "32", "--data.init_args.warmup_frames", "64", "--threads", "1"),
)
SMALL = (*NETS, "--trainer.callbacks.init_args.bare_update_seconds", "0")  # the throughput report's yardstick off


def run_in(folder: Path, *overrides: str):
    return fit(CONFIG, *SMALL, "--trainer.logger.init_args.save_dir", str(folder / "runs"), *overrides)


def checkpoint_of(folder: Path) -> Path:
    return folder / "runs/gym_pendulum_td3/version_0/checkpoints/last.ckpt"


class Snapshots(AfterUpdate):
    """The actor's and the target networks' weights after each update."""

    def __init__(self) -> None:
        self.actor, self.targets = [], []

    def after_update(self, trainer, pl_module) -> None:
        module = pl_module.loss_module
        self.actor.append(module.actor_network_params.detach().clone())
        self.targets.append(
            (module.target_actor_network_params.detach().clone(), module.target_qvalue_network_params.detach().clone())
        )


def changed(a, b) -> bool:
    return not all(torch.equal(x, y) for x, y in zip(a.values(True, True), b.values(True, True), strict=True))


@pytest.mark.slow
def test_the_actor_and_the_targets_move_every_second_update_and_the_warm_up_acts_uniformly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    snapshots = Snapshots()
    config = ["fit", "--config", str(CONFIG), *SMALL, "--trainer.max_steps", "6"]
    cli = main(config, extra_callbacks=[snapshots])
    assert cli.trainer.global_step == 6
    # Updates 1, 3, 5 (counting from 1) train the critics only; 2, 4, 6 the actor too, then move the targets.
    moves = [changed(before, after) for before, after in zip(snapshots.actor, snapshots.actor[1:], strict=False)]
    assert moves == [True, False, True, False, True]  # between updates (1,2), (2,3), ...: the actor moved at 2, 4, 6
    target_moves = [
        changed(a[0], b[0]) and changed(a[1], b[1])
        for a, b in zip(snapshots.targets, snapshots.targets[1:], strict=False)
    ]
    assert target_moves == [True, False, True, False, True]
    # The 64 warm-up frames acted uniformly on the box [-2, 2] (a noisy untrained actor stays near its one action).
    checkpoint = tmp_path / "runs/gym_pendulum_td3/version_0/checkpoints/last.ckpt"
    state = torch.load(checkpoint, weights_only=True)["ReplayDataModule"]
    rows, _ = saved_replay(checkpoint, state)
    warm_up = rows["action"][:64].flatten()
    assert warm_up.min() < -1.5 and warm_up.max() > 1.5 and 0.9 < warm_up.std() < 1.4  # uniform on [-2, 2]: 1.15
    after = rows["action"][64:].flatten()
    assert len(after) > 0 and after.std() < 0.5  # the actor's action plus noise of 0.1 half-range (0.2)


@pytest.mark.slow
def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(tmp_path):
    # The stop falls after a critic-only update; the checkpoint carries the replay buffer, the targets, Adam's state
    # of both groups, every RNG, and the update counter that keeps the delay's rhythm and ends the uniform warm-up.
    full, first_half, resumed = resumed_on_the_racing_car(CONFIG, tmp_path, 30, *NETS)
    assert full.keys() == resumed.keys() and any("target_actor" in key for key in full)
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    moved = [
        key for key in resumed if resumed[key].is_floating_point() and not torch.equal(first_half[key], resumed[key])
    ]
    assert any("target_qvalue" in key for key in moved) and any(key.startswith("actor.") for key in moved)


def test_the_update_loss_is_torchrls_td3_loss_in_values_and_gradients():
    model, data = build([str(CONFIG)], [*SMALL])
    torch.manual_seed(3)  # targets apart from the online networks, so that using the wrong ones would show
    for key in ("target_actor_network_params", "target_qvalue_network_params"):
        for value in getattr(model.loss_module, key).values(True, True):
            value.data.add_(0.05 * torch.randn_like(value))
    batch = as_replay_sample(batch_pool(data, data.batch_size)[0])
    parameters = model.trainable_parameters()
    results = []
    for loss in (model.loss, model.loss_module):
        torch.manual_seed(7)  # the target policy's noise
        losses = loss(batch.clone())
        total = losses["loss_actor"] + losses["loss_qvalue"]
        results.append((losses, torch.autograd.grad(total, parameters, allow_unused=True)))
    (ours, our_grads), (theirs, their_grads) = results
    for term in ("loss_actor", "loss_qvalue"):
        assert torch.allclose(ours[term], theirs[term], rtol=1e-5, atol=1e-6), term
    for mine, torchrls in zip(our_grads, their_grads, strict=True):
        assert (mine is None) == (torchrls is None) and (mine is None or torch.allclose(mine, torchrls, atol=1e-6))


def test_the_bare_update_computes_the_agents_loss_with_and_without_the_actor():
    model, data = build([str(CONFIG)], [*SMALL])
    pool = [as_replay_sample(batch) for batch in batch_pool(data, data.batch_size)]
    # Update 1 (step 0) trains the critics only; update 2 (step 1) the actor too. Each bare loop starts from the
    # model's weights, and the target policy's noise is drawn inside both losses.
    for i, terms in ((0, ("loss_qvalue",)), (1, ("loss_qvalue", "loss_actor"))):
        step = bare_update(model, data)
        torch.manual_seed(7)
        losses = model.loss(pool[i].clone())
        torch.manual_seed(7)
        assert step(i) == pytest.approx(sum(losses[term] for term in terms).item(), rel=1e-5), terms
    # Between actor updates the update computes the critics' loss alone: the same number, from the same draw.
    torch.manual_seed(7)
    alone = model.critic_loss(pool[1].clone())["loss_qvalue"]
    assert torch.equal(alone, losses["loss_qvalue"])


def test_an_unbounded_box_or_a_bad_option_is_one_error_naming_it():
    observation = Composite(observation=Unbounded(shape=(3,)))
    with pytest.raises(ValueError, match="maps a tanh onto a bounded box"):
        TD3(observation, Unbounded(shape=(2,)))
    with pytest.raises(ValueError, match="model.policy_delay must be >= 1"):
        TD3(observation, Bounded(-1.0, 1.0, (2,)), policy_delay=0)
