"""The bare updates: each agent's update arithmetic in plain eager PyTorch, with no framework around it — the yardstick
of what the framework's update costs.

``ThroughputReport`` times the agent's bare update in slices beside the training loop (:class:`BareYardstick`), so
that runs on machines of different speed, or on different days, can be compared, and divides the loop's time per
update by it. Each reference copies the agent's networks and returns ``step(i)``, one update on the ``i``-th of a
few batches of real transitions drawn from the agent's environment before timing: the loss maths written out (the
same as the agent's TorchRL loss computes), backward, gradient clip and a fused Adam step. :func:`bare_update` picks
the agent's (DQN, QR-DQN and PIRL, PPO, A2C, SAC, TQC, CrossQ, TD3, discrete SAC); the agents' own files hold the
agents only.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from compat.torch import foreach_lerp_
from modules.a2c import A2C
from modules.crossq import CrossQ
from modules.discrete_sac import DiscreteSAC
from modules.dqn import DQN
from modules.gaussian import tanh_gaussian_sample
from modules.networks import heads_on_features
from modules.optim import FusedAdamStep
from modules.pde import physics_losses
from modules.pirl import PhysicsInformedDQN
from modules.ppo import PPO, categorical_log_prob_and_entropy, gaussian_log_prob_and_entropy
from modules.qrdqn import QRDQN
from modules.quantiles import quantile_huber
from modules.sac import SAC
from modules.td3 import TD3
from modules.tqc import TQC

POOL = 16  # at most this many distinct pre-drawn batches the bare loop cycles through ...
POOL_TRANSITIONS = 1024  # ... and at most this many transitions in all (Mario's are 256 KiB each, and its emulators
#                          slow to build and step), but 2 batches
MAX_ENVS = 16  # environments that play them: an emulator is slow to build ...
MAX_STEPS = 64  # ... unless that takes more steps than this: a step of a batched env on a GPU costs milliseconds


def transitions(data: Any, size: int, seed: int = 12_345) -> dict[str, torch.Tensor]:
    """``size`` real transitions of random play in the agent's environment, as plain tensors: ``MAX_ENVS``
    environments (more where that would take over ``MAX_STEPS`` steps), stepped and reset when done."""
    envs = min(size, max(MAX_ENVS, math.ceil(size / MAX_STEPS)))
    env = data.make_env(envs, seed)
    steps = []
    with torch.random.fork_rng(devices=[]):  # the same batch for the same seed, and the global RNG left alone
        torch.manual_seed(seed)
        td = env.reset()
        for _ in range(math.ceil(size / envs)):
            td["action"] = env.action_spec.rand()
            out, td = env.step_and_maybe_reset(td)
            steps.append(out)
    env.close()
    out = torch.cat(steps)[:size]
    return {
        "observation": out["observation"],
        "action": out["action"],
        "next_observation": out["next", "observation"],
        "reward": out["next", "reward"].view(-1),
        "terminated": out["next", "terminated"].view(-1),
    }


def batch_pool(data: Any, size: int) -> list[dict[str, torch.Tensor]]:
    """The pre-drawn batches of ``size`` transitions a bare loop cycles through (:data:`POOL` and
    :data:`POOL_TRANSITIONS` bound their number), drawn in one go by :func:`transitions`."""
    count = max(2, min(POOL, POOL_TRANSITIONS // size))
    drawn = transitions(data, size * count)
    return [{key: value[i * size : (i + 1) * size] for key, value in drawn.items()} for i in range(count)]


def optimizer_step(parameters: list[nn.Parameter], optimizer: torch.optim.Optimizer, max_grad_norm: float | None):
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_optimizer(parameters: list[nn.Parameter], model: Any) -> torch.optim.Optimizer:
    """The optimizer the agent's update uses (its options: the fused Adam, AdamW with weight decay, or RMSprop)."""
    return model.optim.build([{"params": parameters}])


def as_replay_sample(batch: dict[str, torch.Tensor]) -> TensorDict:
    """:func:`transitions`' plain tensors as the TensorDict a replay sample is (what the agents' losses read)."""
    flags = batch["terminated"].unsqueeze(-1)
    return TensorDict(
        {
            "observation": batch["observation"],
            "action": batch["action"],
            "next": {
                "observation": batch["next_observation"],
                "reward": batch["reward"].unsqueeze(-1),
                "done": flags,
                "terminated": flags,
            },
        },
        batch_size=[batch["reward"].shape[0]],
    )


def framework_free_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """An agent's own update — its (compiled, with ``compile``) loss, backward, :class:`FusedAdamStep` and soft
    target update — with neither Lightning nor the data path around it, on the same pre-drawn batches as its bare
    update (:func:`bare_update`): what the framework's update step costs before the loop around it.

    It trains ``model`` itself (a copy would not do: the TorchRL loss holds the parameters PIRL's loss reads from its
    network, and a deep copy separates the two), so pass a model built for the measurement. An agent whose actor
    trains on some updates only (``updates_actor``: TD3's and CrossQ's ``policy_delay``) keeps its rhythm here: the
    other updates compute the critics' loss alone, and TD3's targets move on the actor's updates only.
    """
    if data.declared.physics is not None:
        model.physics = data.declared.physics  # what PIRL's setup takes from the data module
    # The loss the agent's update calls (SAC's with its term towards the clone; recurrent PPO's eager trunk and
    # compiled heads), and PIRL's loss inputs.
    loss = model.compiled_loss()
    loss_inputs = getattr(model, "loss_draws", lambda batch: {})
    # The optimizer a fit builds, with its parameter groups (an actor-critic's two): TD3's and CrossQ's updates
    # without the actor then step the critics' group alone, as in a fit, not Adam's own step over a group that lacks
    # some of its gradients.
    optimizer = model.configure_optimizers()
    optimizer_step = FusedAdamStep(optimizer, model.optim.max_grad_norm)
    batches = [as_replay_sample(batch) for batch in batch_pool(data, data.batch_size)]
    updates_actor = getattr(model, "updates_actor", lambda update: True)
    critic_loss = model.compiled(model.critic_loss) if hasattr(model, "updates_actor") else None
    hard_copies = getattr(model, "target", None) is not None and model.target.update == "hard"  # DQN's option

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        with_actor = updates_actor(i)
        losses = loss(batch, **loss_inputs(batch)) if with_actor else critic_loss(batch)
        total = sum(value for key, value in losses.items() if key.startswith("loss"))
        total.backward()
        optimizer_step()
        if model.target_networks and not hard_copies and with_actor:
            model.soft_update()
        return total.detach()

    return step


class BareYardstick:
    """The bare reference update of ``model`` on ``data``, timed in slices: :class:`ThroughputReport
    <callbacks.throughput.ThroughputReport>` takes a slice beside each stretch of the training loop, so that the loop
    and its yardstick are timed at the same moments (this machine's speed drifts within a minute by more than the
    overheads they show).

    On the run's own torch threads, as an independent probe of the same arithmetic beside the run would be: a
    Nature-CNN update takes about two thirds of its one-thread time on two, so a one-thread yardstick made a two-thread
    loop look faster than its own arithmetic. The update runs on copies of the networks, made at the first slice, on
    the data module's device, and under a forked generator (SAC samples actions, PIRL draws collocation points): the
    run's own random draws and weights are untouched. ``exists`` is False for an agent without a bare reference
    (behaviour cloning, recurrent PPO).
    """

    WARMUP_CALLS = 20  #: before the first slice (first allocations), or ``seconds``' worth if fewer

    def __init__(self, model: Any, data: Any) -> None:
        self.model, self.data = model, data
        self.exists = reference_for(model) is not None
        self.step: Callable[[int], Any] | None = None
        self.calls = 0  # calls timed so far: each slice goes on through the pre-drawn batches
        self.timed_seconds = 0.0  # the last slice's timed calls, without the first slice's batches and warm-up
        self.threads = torch.get_num_threads()  # the torch threads of the last slice: the run's

    def slice_ms(self, seconds: float) -> float | None:
        """Milliseconds per bare update over about ``seconds`` (at least one call), or None without a reference."""
        device = torch.device(self.data.device)
        cuda = device.type == "cuda"
        self.threads = torch.get_num_threads()
        with torch.random.fork_rng(devices=[device] if cuda else []):
            if self.step is None:
                self.step = bare_update(self.model, self.data)
                if self.step is None:
                    return None
                start = time.perf_counter()
                for i in range(self.WARMUP_CALLS):
                    self.step(i)
                    if i >= 1 and time.perf_counter() - start > seconds:
                        break
            if cuda:  # GPU work is asynchronous: a slice ends when its kernels have
                torch.cuda.synchronize(device)
            calls, start = 0, time.perf_counter()
            while calls == 0 or time.perf_counter() - start < seconds:
                self.step(self.calls + calls)
                calls += 1
            if cuda:
                torch.cuda.synchronize(device)
            self.calls += calls
            self.timed_seconds = time.perf_counter() - start
            return 1e3 * self.timed_seconds / calls


def reference_for(model: Any) -> Callable[[Any, Any], Callable[[int], torch.Tensor]] | None:
    """The function that builds the bare reference update of ``model``'s agent, or None for an agent without one
    (behaviour cloning, recurrent PPO)."""
    if isinstance(model, PhysicsInformedDQN):
        return lambda model, data: reference_dqn_update(model, data, with_physics=True)
    references = (
        (QRDQN, reference_qrdqn_update),  # before DQN, its base class
        (DQN, reference_dqn_update),
        (A2C, reference_a2c_update),  # before PPO, its base class
        (PPO, reference_ppo_update),
        (TQC, reference_tqc_update),  # before SAC, their base class
        (CrossQ, reference_crossq_update),
        (SAC, reference_sac_update),
        (TD3, reference_td3_update),
        (DiscreteSAC, reference_discrete_sac_update),
    )
    for agent, reference in references:
        if isinstance(model, agent):
            return reference
    return None


def bare_update(model: Any, data: Any) -> Callable[[int], torch.Tensor] | None:
    """The bare reference update of ``model``'s agent on ``data``'s transitions, or None for an agent without one."""
    reference = reference_for(model)
    return None if reference is None else reference(model, data)


# ----------------------------------------------------------------------------------------------- each agent's
def reference_dqn_update(model: DQN, data: Any, with_physics: bool = False) -> Callable[[int], torch.Tensor]:
    """Double-DQN (or plain DQN) target, forward, MSE (or Huber), backward — of each of the batches the update
    accumulates —, clip and fused Adam (AdamW with weight decay) on pre-drawn batches; ``with_physics``: PIRL's physics
    terms too (:mod:`modules.pde`)."""
    online = copy.deepcopy(model.q_network).to(data.device)
    target = copy.deepcopy(online).requires_grad_(False)
    parameters = list(online.parameters())
    optimizer = make_optimizer(parameters, model)
    gamma = float(model.loss_module.value_estimator.gamma)  # PIRL's is 1: its Q-values are probabilities
    huber = model.hparams.get("loss_function", "l2") == "smooth_l1"
    accumulate = model.optim.accumulate_grad_batches
    batches = batch_pool(data, data.batch_size)

    def loss_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            next_q = target(batch["next_observation"])
            if model.hparams.double_dqn:
                best = online(batch["next_observation"]).argmax(-1, keepdim=True)
                next_value = next_q.gather(-1, best).squeeze(-1)
            else:
                next_value = next_q.max(-1).values
            y = batch["reward"] + gamma * (~batch["terminated"]) * next_value
        q = online(batch["observation"]).gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
        loss = F.smooth_l1_loss(q, y) if huber else (q - y).pow(2).mean()
        if with_physics:
            physics = physics_losses(
                online,
                data.declared.physics,
                data.declared.physics.collocation(model.physics_loss.collocation_points, batch["observation"]),
                model.physics_loss.pde_weight,
                model.physics_loss.boundary_weight,
                model.physics_loss.gradient,
            )
            loss = loss + sum(physics.values())
        return loss

    def step(i: int) -> torch.Tensor:
        for k in range(accumulate):
            loss = loss_of(batches[(i * accumulate + k) % len(batches)])
            (loss if accumulate == 1 else loss / accumulate).backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        return loss.detach()

    return step


def reference_qrdqn_update(model: QRDQN, data: Any) -> Callable[[int], torch.Tensor]:
    """The quantile Huber loss (κ = 1) of the taken actions' quantiles against ``r + γ θ(s', a*)``, a* the target
    network's greedy action (the online network's with ``double_dqn``), backward, clip and the fused Adam step."""
    online = copy.deepcopy(model.q_network.quantiles).to(data.device)
    target = copy.deepcopy(online).requires_grad_(False)
    parameters = list(online.parameters())
    optimizer = make_optimizer(parameters, model)
    gamma = model.gamma
    batches = batch_pool(data, data.batch_size)

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        with torch.no_grad():
            next_quantiles = target(batch["next_observation"])  # [batch, actions, N]
            chooser = online(batch["next_observation"]) if model.hparams.double_dqn else next_quantiles
            best = chooser.mean(-1).argmax(-1)
            rows = torch.arange(len(best), device=best.device)
            y = (
                batch["reward"].unsqueeze(-1)
                + gamma * (~batch["terminated"]).unsqueeze(-1) * next_quantiles[rows, best]
            )
        predicted = online(batch["observation"])[rows, batch["action"]]  # [batch, N]
        loss = quantile_huber(predicted, y).sum(-2).mean()  # summed over the predicted quantiles, as QR-DQN's
        loss.backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        return loss.detach()

    return step


def ppo_batches(data: Any, size: int) -> list[dict[str, torch.Tensor]]:
    """The bare loop's pool of minibatches: real transitions (drawn in one go, :func:`batch_pool`: an emulator is slow
    to build) with stand-in rollout statistics (behaviour log-probability, advantages, value
    targets), each batch's drawn from its own seed."""
    batches = batch_pool(data, size)
    for seed, batch in enumerate(batches):
        generator = torch.Generator().manual_seed(seed)
        batch["log_prob"] = torch.full_like(batch["reward"], -1.386)  # log(1/4): a uniform behaviour policy's
        # Drawn on the CPU (the same numbers on any device), then put where the batch lives.
        batch["advantage"] = torch.randn(size, generator=generator).to(batch["reward"].device)
        batch["value_target"] = torch.randn(size, generator=generator).to(batch["reward"].device)
    return batches


def reference_ppo_update(model: PPO, data: Any) -> Callable[[int], torch.Tensor]:
    """Clipped surrogate + entropy bonus + value loss (Huber or squared) on a minibatch, backward, clip, fused Adam."""
    hp = model.loss_options

    def clipped_surrogate(log_prob: torch.Tensor, advantage: torch.Tensor, batch: dict) -> torch.Tensor:
        ratio = (log_prob - batch["log_prob"]).exp()
        clipped = ratio.clamp(1 - hp.clip_epsilon, 1 + hp.clip_epsilon)
        return -torch.min(ratio * advantage, clipped * advantage).mean()

    return reference_policy_gradient_update(model, data, clipped_surrogate)


def reference_a2c_update(model: A2C, data: Any) -> Callable[[int], torch.Tensor]:
    """Policy gradient + entropy bonus + value loss (squared or Huber) on a whole rollout, backward, clip, and the
    agent's optimizer (RMSprop, or Adam)."""
    return reference_policy_gradient_update(model, data, lambda log_prob, advantage, _: -(log_prob * advantage).mean())


def reference_policy_gradient_update(
    model: PPO, data: Any, objective: Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
) -> Callable[[int], torch.Tensor]:
    """PPO's and A2C's update: ``objective(log_prob, advantage, batch)`` + entropy bonus + value loss on a minibatch
    (A2C's: the whole rollout), backward, clip and the agent's optimizer step."""
    actor, critic = copy.deepcopy((model.actor_layers(), model.critic_network))  # one copy of a shared torso
    actor, critic = [layer.to(data.device) for layer in actor], critic.to(data.device)
    parameters = list(dict.fromkeys([*(p for layer in actor for p in layer.parameters()), *critic.parameters()]))
    optimizer = make_optimizer(parameters, model)
    hp = model.loss_options
    squash = model.distribution == "tanh_normal"
    value_loss_of = F.mse_loss if hp.critic_loss == "l2" else F.smooth_l1_loss
    batches = ppo_batches(data, data.minibatch_size)
    log_prob_and_entropy = gaussian_log_prob_and_entropy if model.box_actions else categorical_log_prob_and_entropy
    bounds = model.action_bounds

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        heads, value_head, features = heads_on_features(actor, critic, batch["observation"])
        inputs = {"observation": features, "action": batch["action"]}
        log_prob, entropy = log_prob_and_entropy(heads, inputs, squash, bounds)
        advantage = batch["advantage"]
        if hp.normalize_advantage:
            advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-6)
        value_loss = value_loss_of(value_head(features).squeeze(-1), batch["value_target"])
        loss = objective(log_prob, advantage, batch) - hp.entropy_coef * entropy.mean() + hp.critic_coef * value_loss
        loss.backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        return loss.detach()

    return step


def reference_sac_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """SAC written out (:func:`reference_soft_actor_critic_update`): the clipped double-Q target, the minimum of the
    target critics at a fresh next action; each critic's squared error to it; the actor climbs the critics' minimum."""

    def next_value(values: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(values).amin(0).squeeze(-1)

    def critic_loss(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (value.squeeze(-1) - target).pow(2).mean()

    return reference_soft_actor_critic_update(model, data, next_value, critic_loss, next_value)


def reference_tqc_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """TQC written out (:func:`reference_soft_actor_critic_update`): the target critics' quantiles at a fresh next
    action pooled and sorted, the highest dropped; each critic's quantile Huber loss against what remains; the actor
    climbs the mean of every critic's quantiles."""

    def truncated(values: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(values, -1).sort(-1).values[:, : model.kept_quantiles]

    def critic_loss(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return quantile_huber(value, target).mean()

    def mean_quantile(values: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(values).mean((0, -1))

    return reference_soft_actor_critic_update(model, data, truncated, critic_loss, mean_quantile)


def soft_actor_critic_copies(model: Any, device: torch.device, targets: bool = False) -> SimpleNamespace:
    """What a bare update of SAC's family starts from, copied off the agent onto ``device``: its actor network
    (``observation → (location, scale)``), each critic of the loss module as a plain module (and, with ``targets``,
    each target critic, frozen), log α (a parameter where α is learned), the parameters and the agent's optimizer over
    them, γ, the target entropy and the action box's centre and half-range (None for discrete actions)."""
    actor = copy.deepcopy(model.actor.module[0].module).to(device)
    critics, target_critics = [], []
    names = [(critics, "qvalue_network_params")] + (
        [(target_critics, "target_qvalue_network_params")] if targets else []
    )
    for index in range(model.loss_module.num_qvalue_nets):  # the loss module's own critics (and targets), as modules
        for copies, name in names:
            module = copy.deepcopy(model.qvalue).to(device)
            state = getattr(model.loss_module, name).detach()[index].flatten_keys(".")
            module.load_state_dict({key: value.clone() for key, value in state.items()})
            copies.append(module.module)
    for target in target_critics:
        target.requires_grad_(False)
    learned = isinstance(model.loss_module.log_alpha, nn.Parameter)  # else a fixed α (learn_alpha false)
    log_alpha = model.loss_module.log_alpha.detach().to(device).clone().requires_grad_(learned)
    parameters = [*actor.parameters(), *(p for critic in critics for p in critic.parameters())]
    parameters += [log_alpha] if learned else []
    space = model.action_spec.space
    box = hasattr(space, "low")
    return SimpleNamespace(
        actor=actor,
        critics=critics,
        targets=target_critics,
        log_alpha=log_alpha,
        parameters=parameters,
        optimizer=make_optimizer(parameters, model),
        gamma=float(model.loss_module.value_estimator.gamma),
        target_entropy=float(model.loss_module.target_entropy),
        centre=((space.high + space.low).float() / 2).to(device) if box else None,
        half_range=((space.high - space.low).float() / 2).to(device) if box else None,
    )


def reference_soft_actor_critic_update(
    model: Any,
    data: Any,
    next_value: Callable[[list[torch.Tensor]], torch.Tensor],
    critic_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    actor_value: Callable[[list[torch.Tensor]], torch.Tensor],
) -> Callable[[int], torch.Tensor]:
    """SAC's and TQC's update written out: the target ``r + γ (1 − terminated) (next_value − α·log π)`` from the
    target critics' outputs at a fresh next action, each critic's ``critic_loss`` to it (summed over the critics), the
    actor's ``α·log π − actor_value`` through detached critics, α's loss (moving nothing where α is fixed), backward,
    clip, fused Adam and the Polyak step of the target critics. The tanh-Gaussian's log-density is computed by hand
    (tanh's and the action box's Jacobians), the critics run one after the other rather than batched. Same weights,
    same batches and the same random draws in the same order as the agent's loss."""
    device = data.device
    copies = soft_actor_critic_copies(model, device, targets=True)
    actor, critics, targets, log_alpha = copies.actor, copies.critics, copies.targets, copies.log_alpha
    parameters, optimizer, tau = copies.parameters, copies.optimizer, model.tau
    gamma, target_entropy, centre, half_range = copies.gamma, copies.target_entropy, copies.centre, copies.half_range
    target_pairs = (
        [p.data for target in targets for p in target.parameters()],
        [p.data for critic in critics for p in critic.parameters()],
    )
    batches = batch_pool(data, data.batch_size)

    def sample(observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        location, scale = actor(observation)
        return tanh_gaussian_sample(location, scale, torch.randn_like(location), centre, half_range)

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = sample(batch["next_observation"])
            value = next_value([t(batch["next_observation"], next_action) for t in targets])
            per_sample = (-1,) + (1,) * (value.ndim - 1)  # [batch] beside a value of [batch] or [batch, quantiles]
            continues = (~batch["terminated"]).view(per_sample)
            y = batch["reward"].view(per_sample) + gamma * continues * (value - alpha * next_log_prob.view(per_sample))
        loss_of_critics = sum(critic_loss(c(batch["observation"], batch["action"]), y) for c in critics)
        action, log_prob = sample(batch["observation"])
        detached = [{k: v.detach() for k, v in c.named_parameters()} for c in critics]
        q = actor_value(
            [
                torch.func.functional_call(c, p, (batch["observation"], action))
                for c, p in zip(critics, detached, strict=True)
            ]
        )
        actor_loss = (alpha * log_prob - q).mean()
        alpha_loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
        loss = loss_of_critics + actor_loss + alpha_loss
        loss.backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        foreach_lerp_(*target_pairs, tau)
        return loss.detach()

    return step


def reference_discrete_sac_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """Discrete SAC written out: the target ``r + γ (1 − terminated) Σₐ′ π(a′|s′) (minᵢ Q̄ᵢ(s′, a′) − α log π(a′|s′))``
    from the target critics, each critic's squared (or Huber) error at the taken action summed over the critics, the
    actor's ``Σₐ π(a|s) (α log π(a|s) − minᵢ Qᵢ(s, a))`` through detached critics, α's loss (moving nothing where α is
    fixed), backward, clip, fused Adam and the Polyak step of the target critics. The expectations over the actions
    are exact sums: no random draws. The critics run one after the other."""
    copies = soft_actor_critic_copies(model, data.device, targets=True)
    actor, critics, targets, log_alpha = copies.actor, copies.critics, copies.targets, copies.log_alpha
    huber = model.hparams.loss_function == "smooth_l1"
    target_pairs = (
        [p.data for target in targets for p in target.parameters()],
        [p.data for critic in critics for p in critic.parameters()],
    )
    batches = batch_pool(data, data.batch_size)

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_prob = actor(batch["next_observation"]).softmax(-1)
            next_log_prob = torch.log(torch.where(next_prob == 0, 1e-8, next_prob))
            next_q = torch.stack([t(batch["next_observation"]) for t in targets]).amin(0)
            next_value = (next_prob * (next_q - alpha * next_log_prob)).sum(-1)
            y = batch["reward"] + copies.gamma * (~batch["terminated"]) * next_value
        taken = batch["action"].unsqueeze(-1)
        chosen = [c(batch["observation"]).gather(-1, taken).squeeze(-1) for c in critics]
        loss_of_critics = sum((F.smooth_l1_loss if huber else F.mse_loss)(q, y, reduction="none") for q in chosen)
        log_prob = actor(batch["observation"]).log_softmax(-1)
        with torch.no_grad():
            q = torch.stack([c(batch["observation"]) for c in critics]).amin(0)
        actor_loss = (log_prob.exp() * (alpha * log_prob - q)).sum(-1).mean()
        entropy_term = (log_prob.exp() * log_prob).sum(-1).detach()  # −H(π(·|s))
        alpha_loss = -(log_alpha * (entropy_term + copies.target_entropy)).mean()
        loss = loss_of_critics.mean() + actor_loss + alpha_loss
        loss.backward()
        optimizer_step(copies.parameters, copies.optimizer, model.optim.max_grad_norm)
        foreach_lerp_(*target_pairs, model.tau)
        return loss.detach()

    return step


def reference_crossq_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """CrossQ written out: the actor's next action with its running statistics; the current and next pairs through each
    critic in one training-mode batch, the target from the second half (the critics' minimum less α·log π,
    discounted unless terminated, detached); each critic's squared error to it and, every ``policy_delay``-th update
    once ``actor.warmup_updates`` have passed, the actor's ``α·log π − min Q`` (the actor in training mode, the
    critics detached in evaluation mode) and α's loss; backward, clip and fused Adam. No target networks. Plain
    modules switched between training and evaluation mode, the critics one after the other rather than batched. Same
    weights, statistics, batches and random draws in the same order as the agent's loss."""
    copies = soft_actor_critic_copies(model, data.device)
    actor, critics, log_alpha = copies.actor, copies.critics, copies.log_alpha
    parameters, optimizer, delay = copies.parameters, copies.optimizer, model.policy_delay
    warmup = model.actor_warmup_updates
    gamma, target_entropy, centre, half_range = copies.gamma, copies.target_entropy, copies.centre, copies.half_range
    batches = batch_pool(data, data.batch_size)

    def sample(observation: torch.Tensor, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
        location, scale = actor.train(training)(observation)
        return tanh_gaussian_sample(location, scale, torch.randn_like(location), centre, half_range)

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        alpha, size = log_alpha.detach().exp(), batch["reward"].shape[0]
        with torch.no_grad():
            next_action, next_log_prob = sample(batch["next_observation"], training=False)
        observations = torch.cat([batch["observation"], batch["next_observation"]])
        actions = torch.cat([batch["action"], next_action])
        values = [critic.train()(observations, actions).squeeze(-1).split(size) for critic in critics]
        with torch.no_grad():
            next_q = torch.stack([value[1] for value in values]).amin(0)
            y = batch["reward"] + gamma * (~batch["terminated"]) * (next_q - alpha * next_log_prob)
        loss = sum((value[0] - y).pow(2).mean() for value in values)
        if (i + 1) % delay == 0 and i >= warmup:
            action, log_prob = sample(batch["observation"], training=True)
            detached = [{k: v.detach() for k, v in c.named_parameters()} for c in critics]
            q = torch.stack(
                [
                    torch.func.functional_call(c.eval(), p, (batch["observation"], action)).squeeze(-1)
                    for c, p in zip(critics, detached, strict=True)
                ]
            ).amin(0)
            loss = loss + (alpha * log_prob - q).mean() - (log_alpha * (log_prob.detach() + target_entropy)).mean()
        loss.backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        return loss.detach()

    return step


def reference_td3_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """TD3 written out: the clipped double-Q target from the target critics at the target actor's action plus clipped
    Gaussian noise, both critics' MSE and, every ``policy_delay``-th update, the actor's −Q₁(s, μ(s)) through detached
    critics; backward, clip, fused Adam, and on those updates the Polyak step of the target actor and critics. The
    critics run one after the other rather than vmapped. Same weights, same batches and the same random draws in the
    same order as the agent's loss."""
    device = data.device
    loss_module = model.loss_module

    def plain(module: nn.Module, params: TensorDict) -> nn.Module:
        """A copy of the TensorDictModule ``module`` holding ``params`` (the loss module's), as its plain network."""
        copied = copy.deepcopy(module).to(device)
        copied.load_state_dict({key: value.clone() for key, value in params.detach().flatten_keys(".").items()})
        return copied.module

    actor = plain(model.actor, loss_module.actor_network_params)
    target_actor = plain(model.actor, loss_module.target_actor_network_params).requires_grad_(False)
    count = loss_module.num_qvalue_nets
    critics = [plain(model.qvalue, loss_module.qvalue_network_params[i]) for i in range(count)]
    targets = [plain(model.qvalue, loss_module.target_qvalue_network_params[i]) for i in range(count)]
    for target in targets:
        target.requires_grad_(False)
    parameters = [*actor.parameters(), *(p for critic in critics for p in critic.parameters())]
    optimizer = make_optimizer(parameters, model)
    gamma, tau, delay = float(loss_module.value_estimator.gamma), model.tau, model.policy_delay
    noise_scale, noise_clip = loss_module.policy_noise.to(device), loss_module.noise_clip.to(device)
    low, high = loss_module.min_action.to(device), loss_module.max_action.to(device)
    target_pairs = (
        [p.data for net in (target_actor, *targets) for p in net.parameters()],
        [p.data for net in (actor, *critics) for p in net.parameters()],
    )
    batches = batch_pool(data, data.batch_size)

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        delayed = (i + 1) % delay == 0
        loss = torch.zeros((), device=device)
        if delayed:
            q_first = torch.func.functional_call(
                critics[0],
                {k: v.detach() for k, v in critics[0].named_parameters()},
                (batch["observation"], actor(batch["observation"])),
            )
            loss = loss - q_first.mean()
        noise = (torch.randn_like(batch["action"]) * noise_scale).clamp(-noise_clip, noise_clip)
        with torch.no_grad():
            next_action = (target_actor(batch["next_observation"]) + noise).clamp(low, high)
            next_q = torch.stack([t(batch["next_observation"], next_action).squeeze(-1) for t in targets]).amin(0)
            y = batch["reward"] + gamma * (~batch["terminated"]) * next_q
        loss = loss + sum((c(batch["observation"], batch["action"]).squeeze(-1) - y).pow(2).mean() for c in critics)
        loss.backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        if delayed:
            foreach_lerp_(*target_pairs, tau)
        return loss.detach()

    return step
