"""The actors that act without building the distribution: ProbabilisticActor.forward is their specification."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import (
    InteractionType,
    NormalParamExtractor,
    TensorDictModule,
    TensorDictSequential,
    set_interaction_type,
)
from torchrl.data import Bounded, Categorical, Unbounded
from torchrl.modules import ProbabilisticActor

from modules.actors import CategoricalActor, NormalActor, TanhNormalActor
from modules.gaussian import gaussian_actor

MODES = ["random", "deterministic", "mode"]


def both_forwards(actor: ProbabilisticActor, observation: torch.Tensor, mode: str) -> tuple[TensorDict, TensorDict]:
    """The actor's own forward and ProbabilisticActor.forward on the same observation, from the same random state."""
    outputs = []
    for forward in (actor.forward, lambda data: ProbabilisticActor.forward(actor, data)):
        torch.manual_seed(1)
        with torch.no_grad(), set_interaction_type(InteractionType(mode)):
            outputs.append(forward(TensorDict({"observation": observation}, batch_size=observation.shape[:-1])))
    return outputs[0], outputs[1]


def assert_same_outputs(ours: TensorDict, torchrls: TensorDict) -> None:
    assert set(ours.keys()) == set(torchrls.keys())
    for key in sorted(ours.keys()):
        assert ours[key].shape == torchrls[key].shape and ours[key].dtype == torchrls[key].dtype, key
        assert torch.equal(ours[key], torchrls[key]), key


@pytest.mark.parametrize("writer", ["network", "sequence"])
@pytest.mark.parametrize("batch", [(8,), (3, 5)])
@pytest.mark.parametrize("mode", MODES)
def test_the_categorical_actor_acts_as_torchrls_probabilistic_actor_from_the_same_draws(writer, batch, mode):
    # The same logits, actions (from the same random numbers) and log-probabilities in every interaction mode,
    # whether the logits come from a network (called directly) or from a TensorDict sequence.
    torch.manual_seed(0)
    if writer == "network":
        logits = TensorDictModule(torch.nn.Linear(4, 5), in_keys=["observation"], out_keys=["logits"])
    else:
        logits = TensorDictSequential(
            TensorDictModule(torch.nn.Linear(4, 6), in_keys=["observation"], out_keys=["hidden"]),
            TensorDictModule(torch.nn.Linear(6, 5), in_keys=["hidden"], out_keys=["logits"]),
        )
    actor = CategoricalActor(logits, Categorical(5, shape=batch))
    ours, torchrls = both_forwards(actor, 3 * torch.randn(*batch, 4), mode)  # spread logits: several actions drawn
    written = {"logits", "action", "action_log_prob", *(() if writer == "network" else ("hidden",))}
    assert set(ours.keys()) == {"observation", *written}
    assert_same_outputs(ours, torchrls)
    if mode == "random":
        assert ours["action"].unique().numel() > 1  # sampled, not a mode
    else:
        assert torch.equal(ours["action"], ours["logits"].argmax(-1))


@pytest.mark.parametrize("box", ["bounded", "unbounded"])
@pytest.mark.parametrize("scale", ["state_independent", "state_dependent"])
@pytest.mark.parametrize("mode", MODES)
def test_the_normal_actor_acts_as_torchrls_probabilistic_actor_from_the_same_draws(box, scale, mode):
    # PPO's normal Gaussian (its σ learned or a second head; in the box's units when bounded): the same loc, scale,
    # actions (ε from the same random numbers) and log-densities as ProbabilisticActor over IndependentNormal.
    torch.manual_seed(0)
    low, high = torch.tensor([-2.0, 0.0, -1.0]), torch.tensor([2.0, 1.0, 5.0])
    spec = Bounded(low, high, (3,)) if box == "bounded" else Unbounded(shape=(3,))
    outputs = 3 if scale == "state_independent" else 6
    actor = gaussian_actor(torch.nn.Linear(4, outputs), spec, "normal", scale, init_scale=0.7)
    assert isinstance(actor, NormalActor)
    ours, torchrls = both_forwards(actor, torch.randn(16, 4), mode)
    assert set(ours.keys()) == {"observation", "loc", "scale", "action", "action_log_prob"}
    assert_same_outputs(ours, torchrls)
    sampled = not torch.equal(ours["action"], ours["loc"])
    assert sampled == (mode == "random")


@pytest.mark.parametrize("box", ["unit", "asymmetric"])
@pytest.mark.parametrize("mode", ["random", "deterministic"])
def test_the_tanh_normal_actor_acts_as_torchrls_probabilistic_actor_from_the_same_draws(box, mode):
    # SAC's actor: the same loc, scale and actions (ε from the same random numbers) as ProbabilisticActor over
    # TanhNormal, bit for bit, on the [-1, 1] box (tanh alone) and on one the affine step rescales into.
    torch.manual_seed(0)
    low, high = (
        (-torch.ones(3), torch.ones(3))
        if box == "unit"
        else (torch.tensor([-2.0, 0.0, -1.0]), torch.tensor([2.0, 1.0, 5.0]))
    )
    network = torch.nn.Sequential(torch.nn.Linear(4, 6), NormalParamExtractor(scale_mapping="biased_softplus_0.5"))
    actor = TanhNormalActor(
        TensorDictModule(network, in_keys=["observation"], out_keys=["loc", "scale"]),
        Bounded(low, high, (3,)),
        low,
        high,
        distribution_kwargs={"safe_tanh": False},
    )
    ours, torchrls = both_forwards(actor, 2 * torch.randn(64, 4), mode)
    assert set(ours.keys()) == {"observation", "loc", "scale", "action"}  # SAC's collection stores no log-probability
    assert_same_outputs(ours, torchrls)
    assert ((ours["action"] >= low) & (ours["action"] <= high)).all()
    deterministic = (high + low) / 2 + (high - low) / 2 * ours["loc"].tanh()
    assert torch.allclose(ours["action"], deterministic) == (mode == "deterministic")


def test_the_tanh_normal_actor_has_no_mode_as_torchrls_has_none():
    low, high = -torch.ones(2), torch.ones(2)
    network = torch.nn.Sequential(torch.nn.Linear(4, 4), NormalParamExtractor())
    module = TensorDictModule(network, in_keys=["observation"], out_keys=["loc", "scale"])
    actor = TanhNormalActor(module, Bounded(low, high, (2,)), low, high)
    with pytest.raises(RuntimeError, match="has not analytical mode"), set_interaction_type(InteractionType.MODE):
        actor(TensorDict({"observation": torch.randn(5, 4)}, batch_size=[5]))


def test_the_tanh_normal_stays_torchrls_probabilistic_actor():
    actor = gaussian_actor(torch.nn.Linear(4, 2), Bounded(-1.0, 1.0, (2,)), "tanh_normal", "state_independent")
    assert type(actor) is ProbabilisticActor


@pytest.mark.parametrize("kind", ["categorical", "normal"])
@pytest.mark.parametrize("mode", MODES)
def test_an_actor_without_its_log_probability_acts_as_the_actor_and_follows_its_weights(kind, mode):
    # What evaluations act with (PPO's greedy policy): the same entries as the actor's, bit for bit, but the
    # log-probability, from the same random numbers; the actor itself still writes it; a change of the actor's weights
    # after the copy was taken is acted with.
    torch.manual_seed(0)
    if kind == "categorical":
        actor = CategoricalActor(
            TensorDictModule(torch.nn.Linear(4, 5), in_keys=["observation"], out_keys=["logits"]), Categorical(5)
        )
    else:
        actor = gaussian_actor(torch.nn.Linear(4, 6), Unbounded(shape=(3,)), "normal", "state_dependent")
    greedy = actor.without_log_prob()
    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.mul_(-2.0)  # after the copy: the copy acts with these
    observation = 3 * torch.randn(64, 4)
    ours, torchrls = both_forwards(greedy, observation, mode)
    full, _ = both_forwards(actor, observation, mode)
    assert "action_log_prob" not in ours and "action_log_prob" in full
    assert_same_outputs(ours, full.exclude("action_log_prob"))
    assert_same_outputs(ours, torchrls.exclude("action_log_prob"))  # TorchRL's actor on the same modules
