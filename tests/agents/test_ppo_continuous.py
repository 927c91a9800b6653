"""PPO on a Box action space: the Gaussian's log-probabilities and entropy by hand (normal and tanh-normal), its actions
mapped onto the box, the environment-facing clip, the export, and a short fit on the racing environment; and the
update's loss against TorchRL's ``ClipPPOLoss`` on every kind of action space."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from tensordict import TensorDict
from tensordict.nn import AddStateIndependentNormalScale
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs.utils import ExplorationType, set_exploration_type

from modules.gaussian import ClipAction
from modules.networks import NetworkOptions
from modules.ppo import PPO, GaussianOptions, PPOLossOptions
from tests.helpers import assert_same_losses_and_gradients, fit, write_config

# An asymmetric two-dimensional box: centre (-1, 0), half-range (5, 0.5).
LOW, HIGH = torch.tensor([-6.0, -0.5]), torch.tensor([4.0, 0.5])
CENTRE, HALF_RANGE = (HIGH + LOW) / 2, (HIGH - LOW) / 2
SPECS = {"observation_spec": Composite(observation=Unbounded(shape=(3,))), "action_spec": Bounded(LOW, HIGH, (2,))}
MU, LOG_STD = torch.tensor([0.3, -0.8]), torch.tensor([-0.5, 0.2])  # in half-range units about the centre


def gaussian_ppo(distribution: str, mu: torch.Tensor = MU, log_std: torch.Tensor = LOG_STD, **options) -> PPO:
    """A PPO whose Gaussian has location ``mu`` and log-σ ``log_std`` (box units) whatever the observation."""
    torch.manual_seed(0)
    # Advantages not standardised: the objective is then −mean(ratio · A), A's mean at ratio 1.
    options.setdefault("loss", PPOLossOptions(normalize_advantage=False))
    network, gaussian = NetworkOptions(hidden_sizes=(8,)), GaussianOptions(distribution=distribution)
    ppo = PPO(**SPECS, network=network, gaussian=gaussian, **options)
    last = [module for module in ppo.actor_network.modules() if isinstance(module, torch.nn.Linear)][-1]
    scale = next(module for module in ppo.actor.modules() if isinstance(module, AddStateIndependentNormalScale))
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(mu)
        scale.state_independent_scale.copy_(log_std)
    return ppo


def act(ppo: PPO, rows: int, exploration=ExplorationType.RANDOM, observation=None) -> TensorDict:
    observation = torch.randn(rows, 3) if observation is None else observation
    with torch.no_grad(), set_exploration_type(exploration):
        return ppo.actor(TensorDict({"observation": observation}, batch_size=[rows]))


def with_rollout_statistics(batch: TensorDict) -> TensorDict:
    batch["advantage"] = torch.randn(batch.shape[0], 1)
    batch["value_target"] = torch.zeros(batch.shape[0], 1)
    return batch


def log_one_minus_tanh_squared(u: torch.Tensor) -> torch.Tensor:
    return 2 * (math.log(2) - u - torch.nn.functional.softplus(-2 * u))


def test_normal_log_probability_and_entropy_match_torch_distributions_by_hand():
    ppo = gaussian_ppo("normal")
    batch = act(ppo, 256)
    # By hand: N(centre + half_range · μ, half_range · e^{log σ}) in each dimension, independent.
    by_hand = torch.distributions.Normal(CENTRE + HALF_RANGE * MU, HALF_RANGE * LOG_STD.exp())
    torch.testing.assert_close(batch["action_log_prob"], by_hand.log_prob(batch["action"]).sum(-1))
    assert (batch["action"] < LOW).any() or (batch["action"] > HIGH).any()  # samples leave the box; the env clips
    losses = ppo.loss(with_rollout_statistics(batch))
    # H = Σ (½ + ½ log 2π + log σ_d), σ_d in the action's units.
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + (HALF_RANGE * LOG_STD.exp()).log()).sum()
    torch.testing.assert_close(losses["entropy"], entropy)
    # The stored log-probability is the one the loss scores: every ratio is 1 before the first update.
    assert float(losses["clip_fraction"]) == 0.0
    assert float(losses["loss_objective"].detach()) == pytest.approx(-float(batch["advantage"].mean()), abs=1e-6)


def test_tanh_normal_log_probability_matches_the_change_of_variables_by_hand():
    ppo = gaussian_ppo("tanh_normal")
    batch = act(ppo, 256)
    action = batch["action"].double()
    assert ((action >= LOW) & (action <= HIGH)).all()
    # a = centre + half_range · tanh(u), u ~ N(μ, σ): log p(a) = Σ log N(u; μ, σ) − log half_range − log(1 − tanh²u).
    u = torch.atanh((action - CENTRE) / HALF_RANGE)
    normal = torch.distributions.Normal(MU.double(), LOG_STD.exp().double())
    by_hand = (normal.log_prob(u) - HALF_RANGE.double().log() - log_one_minus_tanh_squared(u)).sum(-1)
    inside = (u.abs() < 3).all(-1)  # tanh's inverse is accurate in float32 away from saturation
    torch.testing.assert_close(batch["action_log_prob"][inside].double(), by_hand[inside], rtol=1e-4, atol=1e-4)
    losses = ppo.loss(with_rollout_statistics(batch))
    assert float(losses["loss_objective"].detach()) == pytest.approx(-float(batch["advantage"].mean()), abs=1e-4)


def test_tanh_normal_entropy_estimate_matches_a_numerical_integral():
    # TorchRL's PPO loss estimates the tanh-normal's entropy from one sample per row: over many rows it is the
    # integral H = Σ_d H[N(μ_d, σ_d)] + E[log(half_range_d · (1 − tanh² u_d))], computed here on a grid.
    ppo = gaussian_ppo("tanh_normal")
    rows = 40_000
    batch = act(ppo, rows, observation=torch.zeros(rows, 3))
    torch.manual_seed(1)
    estimate = float(ppo.loss(with_rollout_statistics(batch))["entropy"].detach())
    mu, sigma, half_range = MU.double(), LOG_STD.exp().double(), HALF_RANGE.double()
    grid = mu + sigma * torch.linspace(-12, 12, 200_001, dtype=torch.float64).unsqueeze(-1)
    density = torch.distributions.Normal(mu, sigma).log_prob(grid).exp()
    expected_log_jacobian = torch.trapezoid(
        density * (half_range.log() + log_one_minus_tanh_squared(grid)), grid, dim=0
    )
    exact = float((0.5 + 0.5 * math.log(2 * math.pi) + sigma.log() + expected_log_jacobian).sum())
    assert estimate == pytest.approx(exact, abs=0.03)


@pytest.mark.parametrize("distribution", ["normal", "tanh_normal"])
def test_deterministic_actions_map_the_gaussian_onto_the_box(distribution):
    # μ = 0 is the box's centre; μ far beyond ±1 its bounds (tanh-normal: squashed; normal: the clip the environment
    # applies, which the export includes). The greedy policy and the exported network agree.
    for mu, expected in ((torch.zeros(2), CENTRE), (torch.full((2,), 20.0), HIGH), (torch.full((2,), -20.0), LOW)):
        ppo = gaussian_ppo(distribution, mu=mu)
        observation = torch.randn(4, 3)
        greedy = act(ppo, 4, ExplorationType.DETERMINISTIC, observation)["action"]
        exported = ppo.export_network()(observation)
        torch.testing.assert_close(exported, expected.expand(4, 2))
        torch.testing.assert_close(greedy.clamp(LOW, HIGH), exported)
    wide = gaussian_ppo(distribution, log_std=torch.full((2,), 1.0))
    assert ppo.clips_actions == (distribution == "normal")
    if distribution == "tanh_normal":
        sampled = act(wide, 1000)["action"]
        assert ((sampled >= LOW) & (sampled <= HIGH)).all()


def test_the_environment_receives_a_normal_sample_clipped_and_the_rollout_keeps_the_sample():
    ppo = gaussian_ppo("normal")
    transform = ppo.env_transform()
    assert [type(t).__name__ for t in transform] == ["ClipAction"]
    action = torch.tensor([[-9.0, 0.2], [5.0, -3.0]])
    td = TensorDict({"action": action.clone()}, batch_size=[2])
    sent = transform.inv(td)
    torch.testing.assert_close(sent["action"], torch.tensor([[-6.0, 0.2], [4.0, -0.5]]))
    torch.testing.assert_close(td["action"], action)  # what the policy took, and PPO scores, is left alone
    assert isinstance(ClipAction(LOW, HIGH), ClipAction)


def test_an_unbounded_box_takes_the_normal_around_zero_unclipped():
    specs = {"observation_spec": SPECS["observation_spec"], "action_spec": Unbounded(shape=(2,))}
    torch.manual_seed(0)
    ppo = PPO(**specs, network=NetworkOptions(hidden_sizes=(8,)))
    assert ppo.env_transform() is None  # nothing to clip into
    observation = torch.randn(4, 3)
    greedy = act(ppo, 4, ExplorationType.DETERMINISTIC, observation)["action"]
    torch.testing.assert_close(ppo.export_network()(observation), greedy)


def test_state_dependent_scale_starts_at_one_half_range():
    torch.manual_seed(0)
    ppo = PPO(**SPECS, network=NetworkOptions(hidden_sizes=(8,)), gaussian=GaussianOptions(scale="state_dependent"))
    batch = act(ppo, 8)
    # The last layer starts 100x smaller: μ near the centre, σ = softplus-biased(≈ 0) ≈ 1 half-range.
    torch.testing.assert_close(batch["scale"], HALF_RANGE.expand(8, 2), rtol=0.05, atol=0)
    torch.testing.assert_close(batch["loc"], CENTRE.expand(8, 2), rtol=0, atol=0.1)


def racing_ppo_config(root, steps: int = 12, **model) -> dict:
    """PPO on the racing environment, small: 4 cars, rollouts of 16 steps, 4 minibatches of 32 per rollout."""
    return {
        "threads": 1,
        "seed_everything": 0,
        "trainer": {
            "max_steps": steps,
            "default_root_dir": str(root),
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "log_every_n_steps": 4,
            "callbacks": [
                {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 10**9}},
            ],
        },
        "model": {
            "class_path": "modules.ppo.PPO",
            "init_args": {"network": {"hidden_sizes": [32]}, "optimizer": {"lr": 0.001, "max_grad_norm": 0.5}, **model},
        },
        "data": {
            "class_path": "datamodules.rollout.RolloutDataModule",
            "init_args": {
                "env": {"class_path": "envs.racing.env.RacingEnv", "init_args": {"max_steps": 100}},
                **{"num_envs": 4, "collect_steps": 16, "minibatch_size": 32, "update_epochs": 2},
                "evaluation": {"episodes": 2},
            },
        },
    }


@pytest.mark.slow
@pytest.mark.parametrize("distribution", ["normal", "tanh_normal"])
def test_continuous_ppo_fits_on_the_racing_environment_and_exports(tmp_path, distribution):
    from app.cli import main
    from app.export import main as export_main

    config = racing_ppo_config(tmp_path, gaussian={"distribution": distribution}, normalize={"observations": True})
    config["trainer"]["callbacks"].append(
        {"class_path": "callbacks.schedule.PeriodicEvaluation", "init_args": {"every_n_frames": 128, "episodes": 2}}
    )
    path = write_config(config, tmp_path / "racing_ppo.yaml")
    cli = fit(path)
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 12 and cli.datamodule.frames == 3 * 64
    for key in ("train/loss", "train/loss_objective", "train/loss_critic", "train/entropy", "eval/return_mean"):
        assert math.isfinite(float(metrics[key])), key
    # The export reads raw observations: the normaliser is part of it, and its action is the clipped (or squashed) mean.
    metadata = export_main(
        ["--ckpt_path", str(tmp_path / "checkpoints/last.ckpt"), "--config", str(path), "--out", str(tmp_path / "x")]
        + ["--batch-sizes", "4", "--backend", "torchscript", "--no-benchmark"]
    )
    assert metadata["output"]["kind"] == "actions" and metadata["checks"]["env_start"]["max_abs_diff"] <= 1e-6
    model = cli.model
    raw = torch.randn(4, 8) * 5
    normalised = model.observation_normalizer(raw)
    greedy = act(model, 4, ExplorationType.DETERMINISTIC, normalised)["action"]
    space = model.action_spec.space
    torch.testing.assert_close(model.export_network()(raw), greedy.clamp(space.low, space.high))
    assert yaml.safe_load(path.read_text())["model"]["init_args"]["gaussian"]["distribution"] == distribution
    # `validate` from the checkpoint normalises with the checkpoint's statistics: the same episodes as the fit's model.
    after_fit = cli.datamodule.evaluate(model.greedy_policy())["return_mean"]
    validated = main(["validate", "--config", str(path), "--ckpt_path", str(tmp_path / "checkpoints/last.ckpt")])
    assert float(validated.trainer.callback_metrics["eval/return_mean"]) == pytest.approx(after_fit, rel=1e-6)


@pytest.mark.parametrize(
    ("action", "gaussian", "loss"),
    [
        ("discrete", {}, {"critic_loss": "smooth_l1"}),
        ("discrete", {}, {"entropy_coef": 0.0}),  # an entropy weighted 0: logged, not back-propagated through
        ("images", {}, {"critic_loss": "l2"}),  # the actor and the critic on one Nature CNN
        ("box", {"distribution": "normal"}, {"critic_loss": "l2"}),
        ("box", {"distribution": "normal", "scale": "state_dependent"}, {"normalize_advantage": False}),
        ("box", {"distribution": "tanh_normal"}, {"critic_loss": "l2"}),
        ("unbounded", {"distribution": "normal"}, {}),
    ],
)
def test_the_update_loss_is_torchrls_clip_ppo_loss_in_values_and_gradients(action, gaussian, loss):
    # The update computes ClipPPOLoss's terms from the networks: the same terms, the same gradient for every parameter
    # and the same random draws (the tanh-normal's entropy is a sampled estimate), for each distribution, on a
    # minibatch whose ratios are away from 1 (the weights moved after acting), some beyond the clip, which has decayed.
    # On images the actor and the critic share the Nature CNN, which the update runs once for both; ClipPPOLoss runs
    # it in each network, their gradients summing in the shared parameters.
    action_spec = {
        "discrete": Categorical(5),
        "images": Categorical(4),
        "box": Bounded(LOW, HIGH, (2,)),
        "unbounded": Unbounded(shape=(2,)),
    }[action]
    torch.manual_seed(0)
    observation_spec, observation = SPECS["observation_spec"], None
    if action == "images":
        observation_spec = Composite(observation=Bounded(0, 255, (2, 36, 36), dtype=torch.uint8))
        observation = torch.randint(0, 256, (256, 2, 36, 36), dtype=torch.uint8)
    ppo = PPO(
        observation_spec,
        action_spec,
        network=NetworkOptions(hidden_sizes=(16,)),
        gaussian=GaussianOptions(**gaussian),
        loss=PPOLossOptions(**{"entropy_coef": 0.03, **loss}),
    )
    if action == "images":
        assert ppo.actor_network.torso is ppo.critic_network.torso
    batch = act(ppo, 256, observation=observation)
    batch["advantage"] = torch.randn(256, 1)
    batch["value_target"] = torch.randn(256, 1)
    with torch.no_grad():
        moved = 0.3 if action != "images" else 0.03  # the CNN's outputs move much more for the same change
        for parameter in ppo.parameters():
            parameter.add_(moved * torch.randn_like(parameter))
        ppo.loss_module.clip_epsilon.fill_(0.1)
    keys = {"loss_objective", "loss_critic", "loss_entropy", "entropy", "clip_fraction", "kl_approx"}
    # A shared torso's gradient is summed in another order (the heads' gradients meet before its backward, not after
    # two backward passes): the first convolution's weights, sums of thousands of products, differ in the last digits.
    gradient_atol = 1e-4 if action == "images" else 1e-5
    losses = assert_same_losses_and_gradients(ppo, ppo.loss_module, ppo.loss, batch, keys, gradient_atol)
    assert 0 < float(losses["clip_fraction"]) < 1
