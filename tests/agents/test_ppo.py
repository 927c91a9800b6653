"""PPO: GAE and the clipped objective by hand; the rollout path serves each frame once per epoch."""

from __future__ import annotations

import pytest
import torch
import yaml
from tensordict import TensorDict
from torchrl.data import Binary, Categorical, Composite
from torchrl.objectives.value import GAE

from envs.gym.env import GymnasiumEnv
from modules.networks import NetworkOptions
from modules.ppo import PPO, PPOLossOptions
from tests.helpers import ROOT, chain_config, fit, write_config

BREAKOUT = yaml.safe_load((ROOT / "configs/gym/breakout_ppo.yaml").read_text())["data"]["init_args"]["env"]["init_args"]
SPECS = {
    "observation_spec": Composite(observation=Binary(n=2, shape=(2,), dtype=torch.uint8)),
    "action_spec": Categorical(2),
}


def constant_critic(ppo: PPO, value: float) -> None:
    last = ppo.critic_network[1][-1]
    with torch.no_grad():
        for parameter in ppo.critic_network.parameters():
            parameter.zero_()
        last.bias.fill_(value)


def test_gae_matches_hand_computation():
    ppo = PPO(**SPECS, network=NetworkOptions(hidden_sizes=(4,)), gamma=0.5, gae_lambda=0.5)
    constant_critic(ppo, 1.0)  # V(s) = 1 everywhere
    rewards = torch.tensor([1.0, 0.0, 2.0])
    done = torch.tensor([False, False, True])
    obs = torch.zeros(1, 3, 2, dtype=torch.uint8)
    rollout = TensorDict(
        {
            "observation": obs,
            "next": {
                "observation": obs.clone(),
                "reward": rewards.view(1, 3, 1),
                "done": done.view(1, 3, 1),
                "terminated": done.view(1, 3, 1),
            },
        },
        batch_size=[1, 3],
    )
    ppo.postprocess(rollout)
    # δ_t = r_t + γ V(s_{t+1}) (1 - done_t) − V(s_t): δ = [1 + 0.5 − 1, 0 + 0.5 − 1, 2 − 1] = [0.5, −0.5, 1]
    # A_2 = 1; A_1 = −0.5 + 0.25 * 1 = −0.25; A_0 = 0.5 + 0.25 * (−0.25) = 0.4375
    expected = torch.tensor([0.4375, -0.25, 1.0])
    assert torch.allclose(rollout["advantage"].view(3), expected)
    assert torch.allclose(rollout["value_target"].view(3), expected + 1.0)


@pytest.mark.parametrize("task", ["cartpole", "breakout"])
def test_gae_on_shared_values_matches_torchrls_gae_calling_the_critic_twice(task):
    # A real rollout crossing terminations and truncations: the values of step t + 1's observations serve as step t's
    # next values except after an ended episode and at the end; TorchRL's GAE runs the critic on both sides.
    torch.manual_seed(0)  # the network's initial weights too: the rollout's episode ends depend on them
    if task == "breakout":
        pytest.importorskip("ale_py")
        env = GymnasiumEnv(num_envs=2, seed=0, **BREAKOUT)  # images, one Nature CNN shared by actor and critic
        ppo, steps = PPO(env.observation_spec[0], env.action_spec[0]), 60
    else:
        env = GymnasiumEnv(num_envs=3, env_id="CartPole-v1", env_kwargs={"max_episode_steps": 10}, seed=0)
        ppo, steps = PPO(env.observation_spec[0], env.action_spec[0], network=NetworkOptions(hidden_sizes=(16,))), 80
    torch.manual_seed(0)
    with torch.no_grad():
        rollout = env.rollout(steps, ppo.policy(), break_when_any_done=False)
    done = rollout["next", "done"].squeeze(-1)
    if task == "cartpole":
        assert (done & rollout["next", "truncated"].squeeze(-1)).any() and rollout["next", "terminated"].any()
    assert done.any()
    reference = rollout.clone()
    GAE(gamma=0.99, lmbda=0.95, value_network=ppo.critic, average_gae=False)(reference)
    rows = []
    hook = ppo.critic_network.register_forward_hook(lambda module, inputs, output: rows.append(output.shape[0]))
    ppo.postprocess(rollout)
    hook.remove()
    assert sum(rows) == done.numel() + done.shape[0] + int(done[:, :-1].sum())  # not 2 * numel
    for key in ("state_value", ("next", "state_value"), "advantage", "value_target"):
        assert torch.allclose(rollout[key], reference[key], atol=1e-5, rtol=1e-5), key
    exact = ppo.advantage(rollout.exclude("advantage", "value_target"))  # TorchRL's GAE module on the same values
    for key in ("advantage", "value_target"):
        assert torch.equal(rollout[key], exact[key]), key
    env.close()


def test_clipped_objective_matches_hand_computation():
    ppo = PPO(
        **SPECS,
        network=NetworkOptions(hidden_sizes=(4,)),
        loss=PPOLossOptions(clip_epsilon=0.2, entropy_coef=0.0, critic_coef=0.0, normalize_advantage=False),
    )
    obs = torch.tensor([[1, 0], [0, 1]], dtype=torch.uint8)
    batch = TensorDict({"observation": obs, "action": torch.tensor([0, 1])}, batch_size=[2])
    with torch.no_grad():
        log_prob = ppo.actor.get_dist(batch.clone()).log_prob(batch["action"])
    ratio = torch.tensor([1.5, 0.5])  # both outside [0.8, 1.2]: the clip binds in opposite directions
    batch["action_log_prob"] = log_prob - ratio.log()
    batch["advantage"] = torch.tensor([[2.0], [-1.0]])
    loss = ppo.loss(batch)["loss_objective"]
    # −mean(min(r A, clip(r) A)): sample 0: min(3.0, 2.4) = 2.4; sample 1: min(−0.5, −0.8) = −0.8
    assert loss.item() == pytest.approx(-(2.4 - 0.8) / 2, abs=1e-5)


@pytest.mark.slow
def test_rollout_minibatches_cover_each_frame_once_per_epoch(tmp_path):
    config = chain_config("ppo", tmp_path, num_envs=4, collect_steps=8, minibatch_size=8, update_epochs=3)
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "1")
    data = cli.datamodule
    assert data.minibatches_per_rollout == 3 * 32 // 8
    order = data.order.view(3, 32)
    for epoch in order:  # each epoch is a permutation of the 32 frames
        assert torch.equal(epoch.sort().values, torch.arange(32))
    assert data.cursor == 1 and data.frames == 32
    # The rest of the rollout's minibatches, cut from one gather per epoch: the rows the order names, in its order.
    for k in range(1, data.minibatches_per_rollout):
        minibatch = data.next_ready_batch()
        expected = data.rollout[data.order[8 * k : 8 * (k + 1)]]
        assert set(minibatch.keys(True, True)) == set(expected.keys(True, True))
        for key in expected.keys(True, True):
            assert torch.equal(minibatch[key], expected[key]), (k, key)
    assert data.batches_ready == 0
    needs = [need.what for need in data.memory_needs(data.device)]
    assert "the rollout" in needs and "an epoch's shuffled rollout" in needs


def test_a_minibatch_of_the_whole_rollout_is_the_rollout_at_every_epoch(tmp_path):
    # One minibatch per epoch (the RL Zoo's CartPole PPO): no shuffled copy, the rollout's own rows, in a new
    # TensorDict each time (what an update writes into its batch stays out of the next epoch's).
    config = chain_config("ppo", tmp_path, num_envs=4, collect_steps=8, minibatch_size=32, update_epochs=3)
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "1")
    data = cli.datamodule
    assert data.cursor == 1
    batches = [data.next_ready_batch() for _ in range(2)]
    for batch in batches:
        assert batch is not data.rollout and batch.shape == (32,)
        assert set(batch.keys(True, True)) == set(data.rollout.keys(True, True))
        for key in batch.keys(True, True):
            assert torch.equal(batch[key], data.rollout[key]), key
    batches[0]["written"] = torch.zeros(32)
    assert "written" not in data.rollout and "written" not in batches[1]
    assert data.batches_ready == 0


@pytest.mark.slow
def test_next_rollout_is_collected_only_after_the_last_minibatch(tmp_path):
    config = chain_config("ppo", tmp_path, num_envs=4, collect_steps=8, minibatch_size=16, update_epochs=2)
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "4")  # exactly one rollout
    assert cli.datamodule.frames == 32
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "5")
    assert cli.datamodule.frames == 64


@pytest.mark.slow
def test_the_clip_falls_linearly_over_clip_decay_frames_set_at_each_rollout(tmp_path):
    # 32 frames per rollout, 4 updates each: 8 updates are two rollouts, the second set at 64 of 128 frames.
    config = chain_config("ppo", tmp_path, num_envs=4, collect_steps=8, minibatch_size=16, update_epochs=2)
    config["model"]["init_args"]["loss"] = {"clip_epsilon": 0.2, "clip_decay_frames": 128}
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "8")
    assert cli.datamodule.frames == 64
    assert cli.model.loss_module.clip_epsilon.item() == pytest.approx(0.2 * (1 - 64 / 128))
    with pytest.raises(ValueError, match="^model.loss.clip_decay_frames must be >= 1 \\(or null\\), got 0$"):
        PPO(**SPECS, loss=PPOLossOptions(clip_decay_frames=0))


def test_the_export_network_gives_the_logits_whose_argmax_the_greedy_policy_acts():
    # `python -m app export` traces export_network(): its argmax must be the action greedy evaluation takes.
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    torch.manual_seed(0)
    ppo = PPO(**SPECS, network=NetworkOptions(hidden_sizes=(8,)))
    observation = torch.randint(0, 2, (64, 2), dtype=torch.uint8)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        greedy = ppo.greedy_policy()(TensorDict({"observation": observation}, batch_size=[64]))["action"]
    logits = ppo.export_network()(observation)
    assert logits.shape == (64, 2)
    assert torch.equal(logits.argmax(-1), greedy)


def test_activation_and_orthogonal_init_build_stable_baselines3s_ppo_networks():
    # SB3's MlpPolicy for PPO (and CleanRL's): tanh between layers; orthogonal weights with gain √2 on hidden layers,
    # 0.01 on the policy's output and 1 on the value's; zero biases.
    torch.manual_seed(0)
    ppo = PPO(**SPECS, network=NetworkOptions(hidden_sizes=(16, 8), activation="tanh", orthogonal_init=True))
    for network, output_gain, outputs in ((ppo.actor_network, 0.01, 2), (ppo.critic_network, 1.0, 1)):
        assert any(isinstance(m, torch.nn.Tanh) for m in network.modules())
        assert not any(isinstance(m, torch.nn.ReLU) for m in network.modules())
        layers = [m for m in network.modules() if isinstance(m, torch.nn.Linear)]
        assert [layer.out_features for layer in layers] == [16, 8, outputs]
        for layer, gain in zip(layers, [2**0.5, 2**0.5, output_gain], strict=True):
            w = layer.weight
            # An orthogonal matrix times the gain: its smaller Gram matrix is gain² times the identity.
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            assert torch.allclose(gram, gain**2 * torch.eye(gram.shape[0]), atol=1e-5)
            assert torch.equal(layer.bias, torch.zeros_like(layer.bias))
    # the defaults: ReLU, PyTorch's own initialisation (non-zero biases)
    relu = PPO(**SPECS, network=NetworkOptions(hidden_sizes=(16,)))
    assert any(isinstance(m, torch.nn.ReLU) for m in relu.actor_network.modules())
    assert any(m.bias.abs().sum() > 0 for m in relu.actor_network.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("critic_loss", ["l2", "smooth_l1"])
def test_the_value_loss_is_the_squared_or_the_huber_error_by_hand(critic_loss):
    loss_options = PPOLossOptions(critic_loss=critic_loss, critic_coef=0.5, entropy_coef=0.0)
    ppo = PPO(**SPECS, network=NetworkOptions(hidden_sizes=(4,)), loss=loss_options)
    constant_critic(ppo, 1.0)  # V(s) = 1 everywhere
    obs = torch.tensor([[1, 0], [0, 1]], dtype=torch.uint8)
    batch = TensorDict({"observation": obs, "action": torch.tensor([0, 1])}, batch_size=[2])
    with torch.no_grad():
        batch["action_log_prob"] = ppo.actor.get_dist(batch.clone()).log_prob(batch["action"])
    batch["advantage"] = torch.zeros(2, 1)
    batch["value_target"] = torch.tensor([[4.0], [1.5]])  # errors 3 and 0.5
    loss = ppo.loss(batch)["loss_critic"].item()
    # l2: 0.5 · mean(3², 0.5²) = 0.5 · 4.625; Huber: 0.5 · mean(3 − 0.5, 0.5 · 0.5²) = 0.5 · 1.3125
    assert loss == pytest.approx(0.5 * (4.625 if critic_loss == "l2" else 1.3125), abs=1e-5)


def test_bad_network_and_value_loss_choices_name_the_flag():
    with pytest.raises(ValueError, match="^model.network.activation must be one of relu, tanh, got 'gelu'$"):
        PPO(**SPECS, network=NetworkOptions(activation="gelu"))
    with pytest.raises(ValueError, match="^model.loss.critic_loss must be one of smooth_l1, l2, got 'l1'$"):
        PPO(**SPECS, loss=PPOLossOptions(critic_loss="l1"))
