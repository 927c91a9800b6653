"""Recurrent PPO: tokens → grid, the LSTM state through collection, BPTT segments against step-by-step, learning."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn import functional as F
from torchrl.collectors import Collector
from torchrl.envs import TransformedEnv
from torchrl.modules import set_recurrent_mode

from envs.testing.recall import CueRecallEnv
from modules.networks import TokenGrid
from modules.ppo import PPOLossOptions
from modules.recurrent_ppo import RecurrentNetworkOptions, RecurrentPPO
from tests.helpers import chain_config, fit, write_config

PAD = 255


def test_tokens_scatter_into_the_grid_cell_by_cell():
    grid = TokenGrid(num_features=3, height=4, width=5)
    grid.scale[:3] = torch.tensor([1.0, 0.5, 0.25])
    tokens = torch.full((2, 4, 3), PAD, dtype=torch.uint8)
    tokens[0, 0] = torch.tensor([1 << 4 | 2, 2, 8])  # y 1, x 2, feature 2, value 8 → 8 * 0.25
    tokens[0, 2] = torch.tensor([3 << 4 | 4, 0, 7])  # the last cell of the view
    tokens[1, 1] = torch.tensor([0, 1, 6])  # y 0, x 0, feature 1 → 6 * 0.5
    tokens[1, 3] = torch.tensor([0, 9, 5])  # a feature id beyond the grid: dropped
    tokens[1, 0] = torch.tensor([2 << 4 | 7, 0, 5])  # a column beyond the view: dropped
    tokens[1, 2] = torch.tensor([0xFE, 2, 4])  # an agent-wide token (its last reward, say): the centre cell
    expected = torch.zeros(2, 3, 4, 5)
    expected[1, 2, 2, 2] = 1.0
    expected[0, 2, 1, 2] = 2.0
    expected[0, 0, 3, 4] = 7.0
    expected[1, 1, 0, 0] = 3.0
    assert torch.equal(grid(tokens), expected)
    # Laid out as the convolutions read it (channels-last, modules/networks.py: as_channels_last), with no copy.
    assert grid(tokens).is_contiguous(memory_format=torch.channels_last)
    # Any leading batch dimensions: [segments, bptt] when training.
    assert torch.equal(grid(tokens.reshape(1, 2, 4, 3)), expected.reshape(1, 2, 3, 4, 5))


def small_model(**options) -> tuple[RecurrentPPO, CueRecallEnv]:
    env = CueRecallEnv(num_envs=1, num_agents=1, length=4)
    network = RecurrentNetworkOptions(lstm_hidden=16, trunk_features=16, grid_features=2, grid_size=11)
    model = RecurrentPPO(env.observation_spec[0, 0], env.action_spec[0, 0], network=network, **options)
    return model, env


def collect(model: RecurrentPPO, calls: int, steps: int = 12):
    env = TransformedEnv(CueRecallEnv(num_envs=3, num_agents=2, length=4, seed=5), model.env_transform())
    collector = Collector(env, model.policy(), frames_per_batch=3 * 2 * steps, total_frames=-1)
    batches = []
    for batch in collector:
        batches.append(batch)
        if len(batches) == calls:
            break
    collector.shutdown()
    return batches


def test_the_lstm_state_is_reset_exactly_at_episode_starts_and_carried_everywhere_else():
    torch.manual_seed(0)
    model, _ = small_model()
    first, second = collect(model, calls=2)  # [3 envs, 2 agents, 12 steps] each; episodes of 4 steps
    is_init = first["is_init"].squeeze(-1)
    assert torch.equal(is_init, (torch.arange(12) % 4 == 0).expand(3, 2, 12))
    h, next_h = first["recurrent_state_h"], first["next", "recurrent_state_h"]
    assert torch.all(h[is_init] == 0)  # each episode starts from a zero state...
    assert torch.all(h[~is_init].abs().sum(-1) > 0)  # ...and carries a real one after its first step
    assert torch.equal(h[:, :, 1:][~is_init[:, :, 1:]], next_h[:, :, :-1][~is_init[:, :, 1:]])
    # Across collector calls the state goes on from where the last call left it (12 steps: a new episode here).
    assert bool(second["is_init"][:, :, 0].all())
    third_step = second["recurrent_state_h"][:, :, 1]
    assert torch.equal(third_step, second["next", "recurrent_state_h"][:, :, 0])


def test_a_bptt_segment_loss_equals_the_loss_of_stepping_the_lstm_one_step_at_a_time():
    torch.manual_seed(0)
    loss = PPOLossOptions(normalize_advantage=False, entropy_coef=0.01, critic_coef=0.5, clip_epsilon=0.2)
    model, _ = small_model(loss=loss)
    rollout = collect(model, calls=1, steps=16)[0]
    model.postprocess(rollout)
    # Segments of 8 steps; episodes of 4, so every segment also crosses an episode start in its middle.
    segments = rollout.reshape(-1, 16).reshape(-1, 2, 8).reshape(-1, 8).select(*model.batch_keys())
    with torch.no_grad():  # change the weights, so that the ratio is not 1 everywhere
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    losses = model.loss(segments.clone())

    # The same loss by hand, running the network one step at a time from each segment's stored first state.
    log_probs, entropies, values = [], [], []
    state = segments[:, 0].select("recurrent_state_h", "recurrent_state_c")
    with set_recurrent_mode(False):
        for t in range(8):
            step = segments[:, t].select("observation", "is_init").update(state)
            out = model.critic(model.actor(step))
            dist = torch.distributions.Categorical(logits=out["logits"])
            log_probs.append(dist.log_prob(segments[:, t]["action"]))
            entropies.append(dist.entropy())
            values.append(out["state_value"])
            state = out["next"].select("recurrent_state_h", "recurrent_state_c")
    log_prob, entropy = torch.stack(log_probs, 1), torch.stack(entropies, 1)
    value = torch.stack(values, 1)
    advantage = segments["advantage"].squeeze(-1)
    ratio = (log_prob - segments["action_log_prob"]).exp()
    objective = -torch.min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
    critic = 0.5 * F.smooth_l1_loss(value, segments["value_target"])
    assert losses["loss_objective"].item() == pytest.approx(objective.item(), abs=1e-6)
    assert losses["loss_critic"].item() == pytest.approx(critic.item(), abs=1e-6)
    assert losses["loss_entropy"].item() == pytest.approx(-0.01 * entropy.mean().item(), abs=1e-6)


@pytest.mark.slow
def test_recurrent_ppo_learns_to_recall_a_cue_that_a_memoryless_policy_cannot(tmp_path):
    # The cue is shown on the first of 4 steps and answered on the last: without memory an agent is right half the
    # time (return 0.5); the random policy's return is the same. A carried, reset and BPTT-trained state gets 1.
    config = chain_config("recurrent", tmp_path, update_epochs=4)
    config["model"]["init_args"]["loss"] = {"clip_epsilon": 0.2}
    # 120 rollouts, 61k agent steps: the step at which a seed learns the recall moves with the CPU's float kernels
    # (on an AVX2 machine seeds 1-6 recalled every cue after 480 steps, seed 0 not yet, and after 960 it did).
    config["trainer"]["max_steps"] = 960
    config["trainer"]["callbacks"].append(
        {"class_path": "callbacks.schedule.PeriodicEvaluation", "init_args": {"every_n_frames": 10**9}}
    )
    cli = fit(write_config(config, tmp_path / "recall.yaml"))
    metrics = cli.datamodule.evaluate(cli.model.greedy_policy(), episodes=64)
    random = cli.datamodule.evaluate_random(episodes=64)
    assert random["return_mean"] == pytest.approx(0.5, abs=0.1)
    assert metrics["return_mean"] >= 0.95, metrics


@pytest.mark.slow
@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"bptt": 5}, "--data.init_args.bptt (5) must divide collect_steps (16) and minibatch_size (128)"),
        ({"minibatch_size": 1024}, "--data.init_args.minibatch_size (1024) is larger than a rollout: num_envs * "),
        ({"bptt": 0}, "--model RecurrentPPO trains on sequence segments: set --data.init_args.bptt"),
    ],
)
def test_bad_segment_options_are_refused_naming_the_flag(tmp_path, capsys, data, message):
    config = write_config(chain_config("recurrent", tmp_path, **data), tmp_path / "c.yaml")
    with pytest.raises(SystemExit) as exited:
        fit(config)
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], errors


@pytest.mark.slow
def test_a_grid_smaller_than_the_environments_features_is_refused(tmp_path, capsys):
    config = chain_config("recurrent", tmp_path)
    config["model"]["init_args"]["network"]["grid_features"] = 1
    with pytest.raises(SystemExit):
        fit(write_config(config, tmp_path / "c.yaml"))
    assert "--model.init_args.network.grid_features 1 is too small for this environment's 2 observation features" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_the_compiled_loss_equals_the_eager_loss_on_segments_with_and_without_resets():
    # Where an episode starts inside a segment, TorchRL's LSTM splits and pads the segment: shapes that depend on the
    # data. The LSTM runs eagerly between the compiled encoder and the compiled heads' loss: two graphs for every
    # layout of resets, and a loss equal to the eager one there, and where segments start episodes.
    torch.manual_seed(0)
    model, _ = small_model(compile=True)
    rollout = collect(model, calls=1, steps=16)[0]
    model.postprocess(rollout)
    rows = rollout.reshape(-1, 16).select(*model.batch_keys())
    compiled = model.compiled_loss()  # what an update computes its loss with
    graphs = counters["stats"]["unique_graphs"]
    for start in (0, 2, 4, 5):  # episodes of 4 steps: resets at different places in the segments, or at their start
        segments = rows[:, start : start + 8]
        eager, fast = model.loss(segments.clone()), compiled(segments.clone())
        for key in ("loss_objective", "loss_critic", "loss_entropy"):
            torch.testing.assert_close(fast[key], eager[key], rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs + 2  # no break and no recompilation


def test_a_checkpoint_whose_loss_ran_the_trunk_loads_its_weights():
    # Until 2026-12-01 the loss's actor held the trunk: a checkpoint of then holds the trunk's weights a second time
    # under the loss and the actor head under another name. It loads, every weight where it was.
    torch.manual_seed(0)
    trained, _ = small_model()
    state = trained.state_dict()
    former = "loss_module.actor_network_params.module.0.module."
    head = {key: state.pop(key) for key in list(state) if key.startswith(former)}
    state.update({former + "1.module." + key.removeprefix(former): value for key, value in head.items()})
    trunk = {key.removeprefix("trunk."): value for key, value in state.items() if key.startswith("trunk.")}
    state.update({f"{former}0.{key}": value for key, value in trunk.items()})
    checkpoint = {"state_dict": state}

    torch.manual_seed(1)
    model, _ = small_model()
    model.on_load_checkpoint(checkpoint)
    model.load_state_dict(checkpoint["state_dict"])  # strict: every entry known, none missing
    for (name, ours), theirs in zip(model.state_dict().items(), trained.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name
