"""The PIRL loss's PDE term: the first-order residual of the safety probability's equation at collocation points.

The safety probability ``V(x) = P(stay safe until the horizon τ runs out | x)`` of a controlled diffusion satisfies,
away from the boundaries, ``∇ₓV · f(x, a*) + ½ tr(σσᵀ ∇²V) = 0`` where ``f`` includes ``dτ/dt = −1`` (so the τ
component of the gradient term is ``−∂V/∂τ``). As in the reference (Hoshino et al., "Autonomous Drifting Based on
Maximal Safety Probability Learning", ITSC 2024, arXiv 2409.03160; method: arXiv 2403.16391), the diffusion term is
left out and the loss penalises the first-order residual at random interior (collocation) points, with ``V = 1`` on the
terminal boundary (τ = 0, safe) and ``V = 0`` on the unsafe boundary.

This is the loss's maths; the drift ``f`` and the collocation box belong to the environment
(:mod:`envs.safety.physics`) and reach the model through its data module (``datamodule.declared.physics``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch


def pde_residual(
    q_function: Callable[[torch.Tensor], torch.Tensor],
    states: torch.Tensor,
    drift: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    method: Literal["autograd", "func"] = "autograd",
) -> torch.Tensor:
    """``∇ₓV · f(x, a*)`` at each state (``−∂V/∂τ`` included through ``dτ/dt = −1``), with ``V = maxₐ Q(x, a)``.

    The best action ``a*`` is picked without gradient, and ``f`` is data (no gradient flows into the dynamics).
    ``∇ₓV`` keeps its graph so that the residual can be minimised with respect to the network: ``autograd`` calls
    ``torch.autograd.grad(create_graph=True)`` on the batch; ``func`` composes ``torch.func.vmap(torch.func.grad)``
    per state. Both give the same numbers.
    """
    states = states.detach()
    if method == "autograd":
        states.requires_grad_(True)
        q_values = q_function(states)
        best = q_values.detach().argmax(-1)
        value = q_values.gather(-1, best.unsqueeze(-1)).squeeze(-1)
        (gradient,) = torch.autograd.grad(value.sum(), states, create_graph=True)
    elif method == "func":
        with torch.no_grad():
            best = q_function(states).argmax(-1)

        def value_of(state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
            return q_function(state).gather(-1, action.unsqueeze(-1)).squeeze(-1)

        gradient = torch.func.vmap(torch.func.grad(value_of))(states, best)
    else:
        raise ValueError(f"method must be autograd or func, got {method!r}")
    with torch.no_grad():
        rates = drift(states, best)
    return (gradient * rates).sum(-1)


# ∇ₓV with its graph makes the loss's backward a double backward, which torch.compile's autograd cannot compile:
# inside a compiled loss the residual runs eagerly, and the rest of the loss compiled (outside one, this is a no-op).
_eager_pde_residual = torch.compiler.disable(pde_residual)


def physics_losses(
    q_network: Callable[[torch.Tensor], torch.Tensor],
    physics: Any,
    collocation: dict[str, torch.Tensor],
    pde_weight: float,
    boundary_weight: float,
    method: Literal["autograd", "func"] = "autograd",
) -> dict[str, torch.Tensor]:
    """The physics-informed terms of the PIRL loss, weighted: ``loss_pde`` and ``loss_boundary`` (a zero weight
    leaves its term out).

    Args:
        q_network: ``states [n, d] -> Q [n, actions]`` (safety probabilities).
        physics: the environment's dynamics (``envs.safety.physics``).
        collocation: the points, drawn by ``physics.collocation``: ``interior``, ``terminal`` and ``unsafe``.
        pde_weight: weight of the mean squared residual ``∇ₓV · f(x, a*)`` at the interior points.
        boundary_weight: weight of ``(V − 1)²`` at τ = 0 plus ``V²`` on the unsafe boundary.
        method: how ``∇ₓV`` is computed (see :func:`pde_residual`).
    """
    losses = {}
    if pde_weight > 0:
        residual = _eager_pde_residual(q_network, collocation["interior"], physics.drift, method)
        losses["loss_pde"] = pde_weight * residual.pow(2).mean()
    if boundary_weight > 0:
        # V → 1 at τ = 0 in the safe set, V → 0 on the unsafe boundary; one forward for both.
        value = q_network(torch.cat((collocation["terminal"], collocation["unsafe"]))).max(-1).values
        terminal, unsafe = value.split([len(collocation["terminal"]), len(collocation["unsafe"])])
        losses["loss_boundary"] = boundary_weight * ((terminal - 1).pow(2).mean() + unsafe.pow(2).mean())
    return losses
