"""The optimizer step of an update: global-norm gradient clipping and an Adam step, run as PyTorch's fused kernels.

``torch.optim.Adam(fused=True).step()`` runs one fused kernel for all parameters, but wraps it in Python (a state
lookup per parameter, grouping by device and dtype, profiler records), and ``clip_grad_norm_`` groups the gradients
again. On a small network such as the Snake MLP at the reference's setting, that wrapping costs more than the kernels
it wraps. ``torch.compile`` does not remove it: the fused optimizer is excluded from tracing (a graph break around
it), and the traced non-fused Adam compiles to a slower CPU kernel than the fused one. So the step calls the kernels
directly (:mod:`compat.torch`), on the optimizer's own state: checkpoints, resume and ``optimizer.state_dict()`` are
those of the plain ``torch.optim.Adam``. The measurements: BENCHMARKS.md, "The update against its bare arithmetic".
"""

from __future__ import annotations

import torch

from compat.torch import clip_grads_by_global_norm_, fused_adam_step_


class FusedAdamStep:
    """``clip_grad_norm_(max_grad_norm)`` + ``optimizer.step()`` + ``zero_grad(set_to_none=True)``, same arithmetic.

    The direct path makes one fused call per parameter group, each with its group's learning rate. The optimizer's
    own ``step()`` runs whenever it does not apply: an optimizer other than a fused Adam without AMSGrad, the first
    step (which creates the state), or a parameter without a gradient.

    Args:
        optimizer: the optimizer whose parameters, hyperparameters and state are used.
        max_grad_norm: clip the gradients' global L2 norm to this first; None: no clipping.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.direct = type(optimizer) is torch.optim.Adam and all(
            group["fused"] and not (group["amsgrad"] or group["maximize"] or group["differentiable"])
            for group in optimizer.param_groups
        )
        # Per group (each has its own learning rate: SAC's actor and critics): exp_avg, exp_avg_sq and step lists.
        self._state: list[tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]] | None = None

    def __call__(self) -> None:
        grads = [p.grad for p in self.params]
        if any(grad is None for grad in grads):
            grads = [grad for grad in grads if grad is not None]
        if self.max_grad_norm is not None and grads:
            clip_grads_by_global_norm_(grads, self.max_grad_norm)  # clip_grads_with_norm_'s arithmetic
        if self._state is None or len(grads) != len(self.params):
            self.optimizer.step()
            self._state = self._bind_state() if self.direct and len(grads) == len(self.params) else None
        else:
            start = 0
            for group, (exp_avgs, exp_avg_sqs, steps) in zip(self.optimizer.param_groups, self._state, strict=True):
                count = len(group["params"])
                beta1, beta2 = group["betas"]
                fused_adam_step_(
                    group["params"],
                    grads[start : start + count],
                    exp_avgs,
                    exp_avg_sqs,
                    steps,
                    lr=group["lr"],  # read every step: a scheduler may change it
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                )
                start += count
        for p in self.params:
            p.grad = None

    def _bind_state(self) -> list[tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]]:
        # After the optimizer's own step, so that the state exists and is the one a resume loaded.
        bound = []
        for group in self.optimizer.param_groups:
            state = [self.optimizer.state[p] for p in group["params"]]
            bound.append(([s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state], [s["step"] for s in state]))
        return bound
