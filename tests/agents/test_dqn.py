"""DQN: the loss against hand-computed targets, ε annealing over frames, target-network sync at its interval."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torchrl.data import Binary, Bounded, Categorical, Composite, Unbounded

from modules.dqn import DQN, ExplorationOptions, TargetOptions
from modules.networks import NetworkOptions
from tests.helpers import AfterUpdate, chain_config, fit, write_config

SPECS = {
    "observation_spec": Composite(observation=Binary(n=2, shape=(2,), dtype=torch.uint8)),
    "action_spec": Categorical(2),
}


def make_dqn(**kwargs) -> DQN:
    torch.manual_seed(0)
    # no hidden layer: Q(s) = W s + b, easy to compute by hand
    return DQN(**SPECS, network=NetworkOptions(hidden_sizes=()), **kwargs)


def linear_q(dqn: DQN, weight: list[list[float]], bias: list[float]) -> None:
    layer = dqn.q_network[1][0]
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    dqn.target_updater.init_()  # target network = online network


def transition(obs, action, next_obs, reward, terminated) -> TensorDict:
    done = torch.tensor([[terminated]])
    return TensorDict(
        {
            "observation": torch.tensor([obs], dtype=torch.uint8),
            "action": torch.tensor([action]),
            "next": {
                "observation": torch.tensor([next_obs], dtype=torch.uint8),
                "reward": torch.tensor([[reward]]),
                "done": done,
                "terminated": done.clone(),
            },
        },
        batch_size=[1],
    )


def test_dqn_loss_matches_hand_computed_td_error():
    dqn = make_dqn(gamma=0.5, loss_function="l2", target=TargetOptions(update="hard"))
    # Q(s) = W s + b with W = [[1, 2], [3, 4]], b = [0.5, -0.5]
    linear_q(dqn, [[1.0, 2.0], [3.0, 4.0]], [0.5, -0.5])
    batch = transition(obs=[1, 0], action=1, next_obs=[0, 1], reward=1.0, terminated=False)
    # Q(s, a=1) = 3 + (-0.5) = 2.5; Q(s') = [2 + 0.5, 4 - 0.5] = [2.5, 3.5] → target = 1 + 0.5 * 3.5 = 2.75
    loss = dqn.loss(batch)["loss"]
    assert loss.item() == pytest.approx((2.75 - 2.5) ** 2)

    terminal = transition(obs=[1, 0], action=1, next_obs=[0, 1], reward=-1.0, terminated=True)
    assert dqn.loss(terminal)["loss"].item() == pytest.approx((-1.0 - 2.5) ** 2)  # no bootstrap past a terminal


def test_double_dqn_evaluates_online_argmax_with_target_network():
    dqn = make_dqn(gamma=1.0, double_dqn=True)
    linear_q(dqn, [[0.0, 0.0], [1.0, 5.0]], [0.0, 0.0])  # online Q(s'=[0,1]) = [0, 5] → argmax a' = 1
    target = dqn.loss_module.target_value_network_params
    target["module", "0", "module", "1", "0", "weight"].data.copy_(torch.tensor([[0.0, 7.0], [0.0, 2.0]]))
    batch = transition(obs=[1, 0], action=0, next_obs=[0, 1], reward=0.0, terminated=False)
    # Q(s, 0) = 0; target = 0 + 1 * Q_target(s', argmax_online) = Q_target(s', 1) = 2 (not max_target = 7)
    assert dqn.loss(batch)["loss"].item() == pytest.approx(2.0**2)


@pytest.mark.parametrize(
    ("options", "extra"),
    [
        ({"loss_function": "l2"}, {}),
        ({"loss_function": "smooth_l1", "double_dqn": True}, {}),
        ({"double_dqn": True, "n_steps": 3}, {"steps_to_next_obs": True}),
        ({"network": NetworkOptions(kind="batch_norm_cnn")}, {"priority_weight": True}),
    ],
    ids=["l2", "huber-double", "n-step", "batch-norm-prioritized"],
)
def test_the_update_loss_is_torchrls_dqn_loss_in_values_gradients_statistics_and_priorities(options, extra):
    # DQN.loss computes DQNLoss's loss from its parameters: the same value and gradients, the same |δ| as DQNLoss's δ²
    # written into the batch, and (the Mario network) BatchNorm's statistics moved alike, online and target.
    torch.manual_seed(0)
    image = options.get("network", NetworkOptions()).kind == "batch_norm_cnn"
    shape, rows = ((4, 36, 36), 16) if image else ((6,), 64)
    observation = Unbounded(shape) if not image else Bounded(0, 255, shape, dtype=torch.uint8)
    network = options.pop("network", NetworkOptions(hidden_sizes=(16,)))
    model = DQN(Composite(observation=observation), Categorical(5), network=network, gamma=0.9, **options)
    with torch.no_grad():
        for value in model.loss_module.target_value_network_params.values(True, True):
            if value.is_floating_point():
                value.add_(0.1 * torch.randn_like(value))  # a target network apart from the online one
    batch = TensorDict(
        {
            "observation": observation.rand((rows,)),
            "action": torch.randint(0, 5, (rows,)),
            "next": {
                "observation": observation.rand((rows,)),
                "reward": torch.randn(rows, 1),
                "done": torch.rand(rows, 1) < 0.3,
            },
        },
        batch_size=[rows],
    )
    batch["next", "terminated"] = batch["next", "done"].clone()
    if extra.get("steps_to_next_obs"):
        batch["steps_to_next_obs"] = torch.randint(1, 4, (rows, 1))
    if extra.get("priority_weight"):
        batch["priority_weight"] = torch.rand(rows) + 0.5
    model.train()
    start = copy.deepcopy(model.state_dict())
    outcomes = []
    for loss in (model.loss_module, model.loss):
        model.load_state_dict(start)
        model.zero_grad()
        given = batch.clone()
        losses = loss(given)
        losses["loss"].backward()
        td_error = losses["td_error"] if "td_error" in losses.keys() else given["td_error"].sqrt().view(-1)  # noqa: SIM118
        gradients = [parameter.grad.clone() for parameter in model.trainable_parameters()]
        statistics = {key: value.clone() for key, value in model.state_dict().items() if "running" in key}
        outcomes.append((losses["loss"].detach(), td_error, gradients, statistics))
    (expected, expected_td, expected_gradients, expected_statistics), (actual, actual_td, gradients, statistics) = (
        outcomes
    )
    assert torch.equal(actual, expected)
    torch.testing.assert_close(actual_td, expected_td, rtol=1e-6, atol=1e-6)
    for a, b in zip(gradients, expected_gradients, strict=True):
        assert torch.equal(a, b)
    assert statistics.keys() == expected_statistics.keys() and (bool(statistics) == image)
    for key, value in expected_statistics.items():
        assert torch.equal(statistics[key], value), key
    assert any(not torch.equal(value, start[key]) for key, value in statistics.items()) == image


def test_epsilon_anneals_linearly_over_frames():
    dqn = make_dqn(exploration=ExplorationOptions(eps_start=1.0, eps_end=0.1, eps_frames=1000))
    assert dqn.epsilon(0) == 1.0
    assert dqn.epsilon(500) == pytest.approx(0.55)
    assert dqn.epsilon(1000) == pytest.approx(0.1)
    assert dqn.epsilon(10**6) == pytest.approx(0.1)


@pytest.mark.slow
def test_epsilon_follows_collected_frames_during_training(tmp_path):
    config = chain_config("dqn", tmp_path)
    config["model"]["init_args"]["exploration"] = {"eps_start": 1.0, "eps_end": 0.0, "eps_frames": 200}
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "20")
    frames = cli.datamodule.frames
    assert 0 < frames < 200
    assert cli.model.egreedy.eps.item() == pytest.approx(1 - frames / 200, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("interval", [5, 7])
def test_hard_target_sync_happens_exactly_at_the_interval(tmp_path, interval):
    config = chain_config("dqn", tmp_path)
    config["model"]["init_args"]["target"] = {"update": "hard", "interval": interval}
    config["trainer"]["callbacks"].append({"class_path": "tests.agents.test_dqn.RecordTargetSyncs"})
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "30")
    recorder = next(cb for cb in cli.trainer.callbacks if isinstance(cb, RecordTargetSyncs))
    assert recorder.synced_at == [step for step in range(1, 31) if step % interval == 0]


class RecordTargetSyncs(AfterUpdate):
    """Records the updates after which the target network equals the online network (i.e. was just copied)."""

    def __init__(self):
        self.synced_at = []

    def after_update(self, trainer, pl_module):
        online = pl_module.loss_module.value_network_params.flatten_keys()
        target = pl_module.loss_module.target_value_network_params.flatten_keys()
        if all(torch.equal(online[key], target[key]) for key in online.keys()):  # noqa: SIM118 (iterating a TensorDict walks its batch)
            self.synced_at.append(trainer.global_step)


def test_soft_update_is_torchrl_soft_update():
    model = DQN(**SPECS, network=NetworkOptions(hidden_sizes=(8,)), target=TargetOptions(update="soft", tau=0.1))
    with torch.no_grad():
        for parameter in model.loss_module.value_network_params.values(True, True):
            parameter.add_(torch.randn_like(parameter))  # online and target now differ
    ours = copy.deepcopy(model)  # soft_update finds its tensors through the copy's own loss module
    before = copy.deepcopy(model.loss_module.target_value_network_params.flatten_keys())
    model.target_updater.step()  # TorchRL's SoftUpdate (which keeps references to the original's tensors)
    ours.soft_update()
    expected = model.loss_module.target_value_network_params.flatten_keys()
    actual = ours.loss_module.target_value_network_params.flatten_keys()
    for key in expected.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch)
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=1e-7)
        assert not torch.equal(actual[key], before[key])  # an average, not a copy


@pytest.mark.parametrize("eps", [0.0, 0.3, 0.9, 1.0])
def test_acting_evaluates_the_network_on_the_greedy_rows_only_and_chooses_what_egreedy_chooses(eps):
    dqn = DQN(**SPECS, network=NetworkOptions(hidden_sizes=(8,)))
    dqn.egreedy.eps.fill_(eps)
    observations = TensorDict({"observation": torch.randint(0, 2, (64, 2), dtype=torch.uint8)}, batch_size=[64])
    rows_seen = []
    dqn.q_network.register_forward_hook(lambda module, args, out: rows_seen.append(out.shape[0]))
    torch.manual_seed(7)
    action = dqn.policy()(observations.clone())["action"]
    torch.manual_seed(7)
    explore = torch.rand(64) < eps  # the rows the policy drew to explore: its first draw
    network_rows = sum(rows_seen)
    # TorchRL's EGreedyModule after the actor (the network on all 64 rows), from the same generator state
    torch.manual_seed(7)
    reference = TensorDictSequential(dqn._acting_actor, dqn.egreedy)(observations.clone())["action"]
    assert torch.equal(action, reference)
    assert dqn._exploring_policy._q_network is not None  # the greedy rows went to the network without TorchRL's passes
    assert network_rows == int((~explore).sum())
    assert 0 < network_rows < 64 if 0 < eps < 1 else network_rows == (64 if eps == 0 else 0)


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_one_row_acting_chooses_what_egreedy_chooses_frame_after_frame(eps):
    """A one-copy loop acts on one row a frame, and there the policy compares its draw with ε on the host: frame after
    frame from one generator state, the actions of TorchRL's EGreedyModule after the actor."""
    dqn = DQN(**SPECS, network=NetworkOptions(hidden_sizes=(8,)))
    dqn.egreedy.eps.fill_(eps)
    frames = torch.randint(0, 2, (300, 1, 2), dtype=torch.uint8)

    def act(policy) -> torch.Tensor:
        torch.manual_seed(7)
        return torch.cat([policy(TensorDict({"observation": frame}, batch_size=[1]))["action"] for frame in frames])

    ours = act(dqn.policy())
    assert torch.equal(ours, act(TensorDictSequential(dqn._acting_actor, dqn.egreedy)))
    greedy = dqn.q_network(frames.squeeze(1)).argmax(-1)
    explored = int((ours != greedy).sum())  # of two actions, a random one differs from the greedy one half the time
    assert explored == 0 if eps == 0 else 0.25 * eps * len(frames) < explored < 0.75 * eps * len(frames)


@pytest.mark.parametrize("update", ["hard", "soft"])
def test_the_target_q_network_is_the_target_parameters_through_updates_loads_copies_and_moves(update):
    """The target pass runs a copy of the Q-network holding the target tensors themselves (TargetCopy), not the
    target parameters swapped in for each pass: it must compute what the swap computes after every way the target
    changes (its updater, a loaded checkpoint, a copy of the model, other tensors in the target's place)."""
    model = DQN(**SPECS, network=NetworkOptions(hidden_sizes=(8,)), target=TargetOptions(update=update, tau=0.3))
    observation = torch.randint(0, 2, (5, 2), dtype=torch.uint8)

    def assert_target_pass(dqn: DQN) -> None:
        params = dqn.loss_module.target_value_network_params
        with torch.no_grad(), params.to_module(dqn.loss_module.value_network):
            swapped = dqn.q_network(observation)
        online = dqn.q_network(observation)
        assert torch.equal(dqn.target_q_network()(observation), swapped)
        assert not torch.equal(swapped, online)  # the target differs from the online network: the check can fail

    def perturb(dqn: DQN) -> None:
        with torch.no_grad():
            for parameter in dqn.loss_module.value_network_params.values(True, True):
                parameter.add_(torch.randn_like(parameter))

    perturb(model)
    assert_target_pass(model)
    model.target_updater.step() if update == "hard" else model.soft_update()
    perturb(model)
    assert_target_pass(model)  # the updater wrote the target in place
    saved = copy.deepcopy(model.state_dict())
    model.target_updater.step() if update == "hard" else model.soft_update()
    model.load_state_dict(saved)  # a checkpoint: copied in place
    assert_target_pass(model)
    copied = copy.deepcopy(model)
    perturb(copied)
    assert_target_pass(copied)
    assert copied.target_q_network() is not model.target_q_network()
    # Other tensors in their place (a load that assigns, say; a move keeps the tensors and changes their data, which
    # the copy shares): the copy is made again.
    target = model.loss_module.target_value_network_params
    for key, value in list(target.items(True, True)):
        target.set(key, value.clone())
    perturb(model)
    model.target_updater.step() if update == "hard" else model.soft_update()  # written into the new tensors
    perturb(model)
    assert_target_pass(model)
    model.eval()
    assert not model.target_q_network().training  # it follows the online network's mode


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_the_acting_network_called_layer_by_layer_computes_what_its_modules_compute(activation):
    """The ε-greedy policy's greedy rows run the Q-network through PlainForward (its layers' functions, without the
    modules' call machinery): the same Q-values to the bit, after an optimizer step and a loaded state too (the
    weights are read at each call); a hook sends the call through the modules, and the policy still pickles."""
    import pickle

    from modules.networks import PlainForward

    dqn = DQN(**SPECS, network=NetworkOptions(hidden_sizes=(16, 16), activation=activation))
    plain = dqn._exploring_policy._q_network[0]
    assert isinstance(plain, PlainForward)
    observation = torch.randint(0, 2, (5, 2), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.equal(plain(observation), dqn.q_network(observation))
        flat = torch.randn(5, 2)  # a flat float32 observation passes its flattening as it is
        assert torch.equal(plain(flat), dqn.q_network(flat))
        before = plain(observation).clone()
        saved = copy.deepcopy(dqn.q_network.state_dict())
        for parameter in dqn.q_network.parameters():
            parameter.add_(torch.randn_like(parameter))  # an optimizer's step: in place
        assert not torch.equal(plain(observation), before)
        assert torch.equal(plain(observation), dqn.q_network(observation))
        dqn.q_network.load_state_dict(saved)
        assert torch.equal(plain(observation), before)
    calls = []
    handle = dqn.q_network.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    plain(observation)
    handle.remove()
    assert calls == [torch.Size([5, 2])]  # the hook ran: the call went through the modules
    plain(observation)
    assert len(calls) == 1
    restored = pickle.loads(pickle.dumps(dqn._exploring_policy))  # what a collector worker receives
    with torch.no_grad():
        assert torch.equal(restored._q_network[0](observation), before)


def test_a_network_of_other_layers_is_called_through_its_modules():
    from torch import nn

    from modules.networks import FlattenObservation, PlainForward

    assert PlainForward.of(nn.Sequential(FlattenObservation((2,)), nn.Linear(2, 3), nn.ReLU())) is not None
    assert PlainForward.of(nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3))) is None
    assert PlainForward.of(nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.BatchNorm1d(3)))) is None


@pytest.mark.parametrize("kind", ["mlp", "batch_norm_cnn"])
def test_the_fused_hard_update_copies_what_torchrls_hard_update_copies(kind):
    """DQN's hard target update is one fused copy (RLModule.hard_update) of what TorchRL's HardUpdate.step copies: the
    online network's parameters into the target's (BatchNorm's statistics stay the target's own); and it reaches the
    target again after a loaded checkpoint (the copied tensors are the target's own)."""
    image = kind == "batch_norm_cnn"
    observation = Bounded(0, 255, (4, 36, 36), dtype=torch.uint8) if image else Unbounded((6,))
    network = NetworkOptions(kind=kind) if image else NetworkOptions(hidden_sizes=(16,))
    ours = DQN(Composite(observation=observation), Categorical(5), network=network)
    with torch.no_grad():  # every online entry apart from the target's, BatchNorm's statistics too
        for value in ours.loss_module.value_network_params.values(True, True):
            value.add_(torch.randn_like(value) if value.is_floating_point() else 1)
    theirs = copy.deepcopy(ours)  # the fused copy runs on this one: TorchRL's updater on the model it was built for
    target = theirs.loss_module.target_value_network_params
    before = target.clone()
    theirs.hard_update()
    ours.target_updater.step()
    expected = ours.loss_module.target_value_network_params
    online = ours.loss_module.value_network_params
    copied = 0
    for key in expected.keys(True, True):
        assert torch.equal(target.get(key), expected.get(key)), key
        copied += not torch.equal(target.get(key), before.get(key))
    assert copied == sum(1 for value in online.values(True, True) if value.requires_grad)  # the parameters changed
    if image:  # and the statistics, which TorchRL's copy leaves, did not: the check tells the two apart
        assert copied < len(list(expected.keys(True, True)))
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))  # a checkpoint: copied in place
    with torch.no_grad():
        for value in theirs.loss_module.value_network_params.values(True, True):
            value.add_(0.5 if value.is_floating_point() else 1)
    theirs.hard_update()  # the copy reaches the target after a load: the same tensors, written in place
    for key, value in theirs.loss_module.value_network_params.items(True, True):
        if value.requires_grad:
            assert torch.equal(target.get(key), value), key
