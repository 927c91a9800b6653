"""Which agent acts in which space: SAC on any bounded box (its actions rescaled onto it), DQN on discrete spaces, PPO
on both; the Nature CNN for image observations; and one error line, naming the flag and the environment, for what an
agent cannot act in or read."""

from __future__ import annotations

import pytest
import torch
from jsonargparse import Namespace
from tensordict import TensorDict
from torchrl.data import Binary, Bounded, Categorical, Composite, MultiCategorical, OneHot, Unbounded
from torchrl.envs.utils import ExplorationType, set_exploration_type

from app.errors import environment_name
from modules.dqn import DQN
from modules.networks import BatchNormCNN, NatureCNN, NetworkOptions, TokenEncoder, observation_network
from modules.ppo import PPO, GaussianOptions
from modules.sac import SAC, ActorOptions, CriticOptions
from modules.spaces import SpaceError
from tests.agents.test_ppo_continuous import racing_ppo_config
from tests.helpers import fit, write_config

VECTOR = Composite(observation=Unbounded(shape=(3,)))
PENDULUM = Bounded(low=-2.0, high=2.0, shape=(1,))
ASYMMETRIC = Bounded(low=torch.tensor([-6.0, -0.4, 0.0]), high=torch.tensor([4.0, 0.4, 10.0]), shape=(3,))


def sac_with_location(action_spec, location: float) -> SAC:
    """SAC whose actor's Gaussian has location ``location`` (pre-tanh) in every dimension, whatever the state."""
    torch.manual_seed(0)
    model = SAC(VECTOR, action_spec, actor=ActorOptions(hidden_sizes=(8,)), critics=CriticOptions(hidden_sizes=(8,)))
    last = model.actor_network[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        last.bias[: action_spec.shape[0]] = location
    return model


@pytest.mark.parametrize("action_spec", [PENDULUM, ASYMMETRIC], ids=["pendulum", "asymmetric"])
def test_sac_maps_its_actions_onto_any_bounded_box(action_spec):
    low, high = action_spec.space.low, action_spec.space.high
    observation = torch.randn(64, 3)
    # The deterministic action centre + half_range · tanh(μ): the centre at μ = 0, the bounds at μ = ±20.
    for location, expected in ((0.0, (low + high) / 2), (20.0, high), (-20.0, low)):
        model = sac_with_location(action_spec, location)
        with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
            action = model.actor(TensorDict({"observation": observation}, batch_size=[64]))["action"]
        torch.testing.assert_close(action, expected.expand(64, -1))
        torch.testing.assert_close(model.export_network()(observation), expected.expand(64, -1))
    # Sampled actions stay inside the box, spread over it.
    with set_exploration_type(ExplorationType.RANDOM), torch.no_grad():
        model = sac_with_location(action_spec, 0.0)
        sampled = model.actor(TensorDict({"observation": torch.randn(4096, 3)}, batch_size=[4096]))["action"]
    assert ((sampled >= low) & (sampled <= high)).all()
    assert ((sampled - low) / (high - low) < 0.1).any(0).all() and ((sampled - low) / (high - low) > 0.9).any(0).all()
    # The critics read the action scaled back to [−1, 1]: the bounds and the centre by hand.
    critic = model.qvalue.module
    unit = (torch.stack([low, (low + high) / 2, high]) - critic.centre) / critic.half_range
    torch.testing.assert_close(unit, torch.tensor([-1.0, 0.0, 1.0]).unsqueeze(-1).expand_as(unit))


SPACE_ERRORS = [
    (
        DQN,
        Bounded(low=torch.tensor([-6.0, -0.5]), high=torch.tensor([4.0, 0.5]), shape=(2,)),
        {},
        "--model modules.dqn.DQN acts in a discrete action space; the environment has a Box action space (Bounded, "
        "shape [2], low [-6.0, -0.5], high [4.0, 0.5]): use modules.sac.SAC or modules.ppo.PPO",
    ),
    (
        DQN,
        MultiCategorical([3, 2]),
        {},
        "--model modules.dqn.DQN acts in a discrete action space; the environment has a MultiCategorical action space "
        "(shape [2]), which no agent here acts in",
    ),
    (
        PPO,
        MultiCategorical([3, 2]),
        {},
        "--model modules.ppo.PPO acts in a discrete or a Box action space; the environment has a MultiCategorical "
        "action space (shape [2]), which no agent here acts in",
    ),
    (
        DQN,
        OneHot(3),
        {},
        "--model modules.dqn.DQN acts in a discrete action space; the environment has a OneHot action space "
        "(shape [3]), which no agent here acts in",
    ),
    (
        PPO,
        Binary(n=4),
        {},
        "--model modules.ppo.PPO acts in a discrete or a Box action space; the environment has a Binary action space "
        "(shape [4]), which no agent here acts in",
    ),
    (
        PPO,
        Unbounded(shape=(2,)),
        {"gaussian": GaussianOptions(distribution="tanh_normal")},
        "model.gaussian.distribution tanh_normal squashes actions into a bounded box; the environment has an "
        "unbounded Box action space (Unbounded, shape [2]): use normal",
    ),
    (
        SAC,
        Categorical(4),
        {},
        "--model modules.sac.SAC acts in a Box action space; the environment has a discrete action space (Categorical, "
        "4 actions): use modules.dqn.DQN, modules.ppo.PPO or modules.discrete_sac.DiscreteSAC",
    ),
    (
        SAC,
        Unbounded(shape=(2,)),
        {},
        "--model modules.sac.SAC squashes its actions into a bounded box (tanh); the environment has an unbounded Box "
        "action space (Unbounded, shape [2]): use modules.ppo.PPO (gaussian.distribution normal)",
    ),
]


@pytest.mark.parametrize(("agent", "action_spec", "options", "message"), SPACE_ERRORS)
def test_an_action_space_the_agent_cannot_act_in_is_one_line(agent, action_spec, options, message):
    with pytest.raises(SpaceError) as error:
        agent(VECTOR, action_spec, **options)
    assert str(error.value) == message
    assert error.value.naming("Pendulum-v1") == message.replace("the environment", "Pendulum-v1")


def test_discrete_agents_act_in_any_categorical_space():
    for agent in (DQN, PPO):
        model = agent(VECTOR, Categorical(7), network=NetworkOptions(hidden_sizes=(8,)))
        with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
            action = model.greedy_policy()(TensorDict({"observation": torch.randn(5, 3)}, batch_size=[5]))["action"]
        assert action.shape == (5,) and Categorical(7).is_in(action), agent.__name__


def test_an_observation_the_network_cannot_read_is_one_line_naming_the_flag():
    dict_observation = Composite(observation=Composite(position=Unbounded(shape=(2,)), image=Unbounded(shape=(4,))))
    with pytest.raises(SpaceError, match=r"^--model modules.ppo.PPO reads one observation tensor .*dict \(image, pos"):
        PPO(dict_observation, Categorical(2))
    with pytest.raises(SpaceError, match=r"^--model modules.sac.SAC reads a flat observation vector; the environment"):
        SAC(Composite(observation=Unbounded(shape=(3, 4))), PENDULUM)
    with pytest.raises(SpaceError, match=r"^model.network.kind nature_cnn reads images \[C, H, W\] or \[H, W"):
        DQN(VECTOR, Categorical(2), network=NetworkOptions(kind="nature_cnn"))
    snake = Composite(observation=Bounded(0, 1, shape=(3, 10, 10), dtype=torch.uint8))
    with pytest.raises(SpaceError, match=r"^model.network.kind nature_cnn reads images of at least 36x36"):
        PPO(snake, Categorical(4), network=NetworkOptions(kind="nature_cnn"))
    with pytest.raises(ValueError, match=r"^model.network.kind must be one of auto, mlp, nature_cnn"):
        observation_network(snake["observation"], "resnet", [8], 4)


def test_the_command_line_names_the_environment_in_one_line(tmp_path, capsys):
    config = racing_ppo_config(tmp_path)
    config["model"] = {"class_path": "modules.dqn.DQN"}
    config["data"] = {
        "class_path": "datamodules.replay.ReplayDataModule",
        "init_args": {"env": {"class_path": "envs.racing.env.RacingEnv"}, "num_envs": 2},
    }
    with pytest.raises(SystemExit) as exit_info:
        fit(write_config(config, tmp_path / "dqn_racing.yaml"))
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --model modules.dqn.DQN acts in a discrete action space; envs.racing.env.RacingEnv has a "
        "Box action space (Bounded, shape [2], low [-6.0, -0.4363], high [4.0, 0.4363]): use modules.sac.SAC or "
        "modules.ppo.PPO"
    ]
    assert not (tmp_path / "checkpoints").exists()
    # A Gymnasium environment is named by its id.
    gym = Namespace(
        data=Namespace(
            init_args=Namespace(env=Namespace(class_path="x.GymnasiumEnv", init_args=Namespace(env_id="Pendulum-v1")))
        )
    )
    assert environment_name(gym) == "Pendulum-v1"


IMAGES = {
    "chw": Bounded(0, 255, shape=(4, 84, 84), dtype=torch.uint8),
    "hwc": Bounded(0, 255, shape=(84, 84, 3), dtype=torch.uint8),
}


def test_the_nature_cnn_is_mnih_et_al_reading_uint8_pixels_in_either_channel_order():
    network = observation_network(IMAGES["chw"], "auto", [256], 6)
    assert isinstance(network, NatureCNN) and not network.channels_last
    convolutions = [(m.out_channels, m.kernel_size, m.stride) for m in network.features if hasattr(m, "kernel_size")]
    assert convolutions == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]
    assert [(m.in_features, m.out_features) for m in network.head if hasattr(m, "in_features")] == [
        (3136, 512),
        (512, 6),
    ]
    # uint8 pixels are divided by 255 inside: the same weights on floats in [0, 1] give the same outputs.
    pixels = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    floats = NatureCNN((4, 84, 84), 6, pixels=False)
    floats.load_state_dict(network.state_dict())
    torch.testing.assert_close(network(pixels), floats(pixels.float() / 255))
    # [H, W, C] images are read channels-last: the same weights on the permuted image give the same outputs.
    channels_last = observation_network(IMAGES["hwc"], "nature_cnn", [256], 6)
    assert channels_last.channels_last
    channels_first = NatureCNN((3, 84, 84), 6)
    channels_first.load_state_dict(channels_last.state_dict())
    image = torch.randint(0, 256, (5, 84, 84, 3), dtype=torch.uint8)
    torch.testing.assert_close(channels_last(image), channels_first(image.permute(0, 3, 1, 2)))
    # Leading batch dimensions are kept (PPO's [envs, steps] rollouts).
    assert network(torch.zeros(2, 3, 4, 84, 84, dtype=torch.uint8)).shape == (2, 3, 6)


@pytest.mark.parametrize("cnn", ["nature", "mario", "tokens"])
def test_every_cnn_convolves_channels_last_images_and_computes_what_nchw_ones_give(cnn):
    # The layout is for speed (modules/networks.py, as_channels_last): every convolution is handed channels-last
    # images, forward and backward give the NCHW computation's values up to rounding, and the weights keep their own
    # layout (checkpoints and the weights collector workers share are as before).
    torch.manual_seed(0)
    if cnn == "tokens":
        network = TokenEncoder(20, 13, 13)
        tokens = torch.stack(
            [torch.randint(0, 13, (6, 50)) << 4 | torch.randint(0, 13, (6, 50)), torch.randint(0, 20, (6, 50))]
            + [torch.randint(0, 256, (6, 50))],
            dim=-1,
        ).to(torch.uint8)
        observation, images = tokens, lambda: network.grid(tokens)
    else:
        observation = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
        if cnn == "nature":
            network = NatureCNN((4, 84, 84), 6)
            images = lambda: observation.float() * network.scale  # noqa: E731 - the network's own scaling
        else:
            network = BatchNormCNN((4, 84, 84), 7)
            images = lambda: observation.float() / 255.0  # noqa: E731
    convolutions = [module for module in network.modules() if isinstance(module, torch.nn.Conv2d)]
    layouts = []
    for convolution in convolutions:
        convolution.register_forward_pre_hook(
            lambda _, args: layouts.append(args[0].is_contiguous(memory_format=torch.channels_last))
        )
    output = network(observation)
    assert layouts == [True] * len(convolutions)
    assert all(parameter.is_contiguous() for parameter in network.parameters())

    def nchw(images: torch.Tensor) -> torch.Tensor:
        features = network.conv if cnn == "tokens" else network.features
        return network.head(features(images.contiguous()))

    torch.testing.assert_close(output, nchw(images()), rtol=1e-4, atol=1e-5)
    output.square().sum().backward()
    gradients = [parameter.grad.clone() for parameter in network.parameters()]
    network.zero_grad()
    nchw(images()).square().sum().backward()
    for channels_last, reference in zip(gradients, [parameter.grad for parameter in network.parameters()], strict=True):
        torch.testing.assert_close(channels_last, reference, rtol=1e-3, atol=1e-4)


def test_auto_takes_the_nature_cnn_for_images_only_and_keeps_the_shipped_networks():
    snake = Bounded(0, 1, shape=(3, 10, 10), dtype=torch.uint8)  # Snake's planes: too small, read flattened
    float_image = Unbounded(shape=(4, 84, 84))
    for spec in (snake, float_image, Unbounded(shape=(8,))):
        assert not isinstance(observation_network(spec, "auto", [8], 4), NatureCNN)
    # DQN's Q-network reads images with a Nature CNN; PPO's actor and critic share one, a linear head each.
    image = Composite(observation=IMAGES["hwc"])
    ppo, dqn = PPO(image, Categorical(6)), DQN(image, Categorical(6))
    assert isinstance(dqn.q_network, NatureCNN)
    assert isinstance(ppo.actor_network.torso, NatureCNN) and ppo.actor_network.torso is ppo.critic_network.torso
    assert ppo.actor_network.head.out_features == 6 and ppo.critic_network.head.out_features == 1
    observation = torch.randint(0, 256, (2, 84, 84, 3), dtype=torch.uint8)
    assert dqn.q_network(observation).shape == (2, 6) and ppo.critic_network(observation).shape == (2, 1)
    # mlp explicitly on an image flattens it; batch_norm_cnn stays DQN's.
    mlp = NetworkOptions(kind="mlp", hidden_sizes=(8,))
    assert not isinstance(PPO(image, Categorical(6), network=mlp).actor_network, NatureCNN)
