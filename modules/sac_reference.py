"""SAC's update in plain eager PyTorch (:class:`~modules.sac.SAC`'s ``reference_update``): the yardstick of its cost
(:mod:`modules.bare`), with the same weights, batches and random draws as the agent's loss."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from compat.torch import foreach_lerp_
from modules.bare import batch_pool, make_adam, optimizer_step
from modules.gaussian import tanh_gaussian_sample


def reference_sac_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """SAC written out: the clipped double-Q target from the target critics at a fresh next action, both critics'
    MSE, the actor's ``α·log π − min Q`` through detached critics, α's loss, backward, clip, fused Adam and the
    Polyak step of the target critics. The tanh-Gaussian's log-density is computed by hand (tanh's and the action
    box's Jacobians), the critics run one after the other rather than vmapped. Same weights, same batches and the same
    random draws in the same order as the agent's loss."""
    device = data.device
    actor = copy.deepcopy(model.actor.module[0].module).to(device)  # observation -> (location, scale)
    critics, targets = [], []
    for index in range(model.loss_module.num_qvalue_nets):  # SACLoss's own critics and targets, as plain modules
        for copies, name in ((critics, "qvalue_network_params"), (targets, "target_qvalue_network_params")):
            module = copy.deepcopy(model.qvalue).to(device)
            state = getattr(model.loss_module, name).detach()[index].flatten_keys(".")
            module.load_state_dict({key: value.clone() for key, value in state.items()})
            copies.append(module.module)
    for target in targets:
        target.requires_grad_(False)
    log_alpha = model.loss_module.log_alpha.detach().to(device).clone().requires_grad_(True)
    parameters = [*actor.parameters(), *(p for critic in critics for p in critic.parameters()), log_alpha]
    optimizer = make_adam(parameters, model)
    gamma, tau = float(model.loss_module.value_estimator.gamma), model.tau
    target_entropy = float(model.loss_module.target_entropy)
    space = model.action_spec.space
    centre, half_range = (
        ((space.high + space.low).float() / 2).to(device),
        ((space.high - space.low).float() / 2).to(device),
    )
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
            next_q = torch.stack([t(batch["next_observation"], next_action).squeeze(-1) for t in targets]).amin(0)
            y = batch["reward"] + gamma * (~batch["terminated"]) * (next_q - alpha * next_log_prob)
        critic_loss = sum((c(batch["observation"], batch["action"]).squeeze(-1) - y).pow(2).mean() for c in critics)
        action, log_prob = sample(batch["observation"])
        detached = [{k: v.detach() for k, v in c.named_parameters()} for c in critics]
        q = (
            torch.stack(
                [
                    torch.func.functional_call(c, p, (batch["observation"], action))
                    for c, p in zip(critics, detached, strict=True)
                ]
            )
            .amin(0)
            .squeeze(-1)
        )
        actor_loss = (alpha * log_prob - q).mean()
        alpha_loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
        loss = critic_loss + actor_loss + alpha_loss
        loss.backward()
        optimizer_step(parameters, optimizer, model.optim.max_grad_norm)
        foreach_lerp_(*target_pairs, tau)
        return loss.detach()

    return step
