"""The optimizer of an update: its options, shared by every agent (:class:`OptimizerOptions`: Adam, or RMSprop for
A2C, PyTorch's or TensorFlow's: :class:`TFLikeRMSprop`), and its step, global-norm gradient clipping and an Adam
step run as PyTorch's fused kernels (:class:`FusedAdamStep`).

``torch.optim.Adam(fused=True).step()`` runs one fused kernel for all parameters, but wraps it in Python (a state
lookup per parameter, grouping by device and dtype, profiler records), and ``clip_grad_norm_`` groups the gradients
again. On a small network such as the Snake MLP at the reference's setting, that wrapping costs more than the kernels
it wraps. ``torch.compile`` does not remove it: the fused optimizer is excluded from tracing (a graph break around
it), and the traced non-fused Adam compiles to a slower CPU kernel than the fused one. So the step calls the kernels
directly (:mod:`compat.torch`), on the optimizer's own state: checkpoints, resume and ``optimizer.state_dict()`` are
those of the plain ``torch.optim.Adam``. The measurements: docs/results/snake.md, "The update against its bare
arithmetic".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from compat.torch import clip_grads_by_global_norm_, fused_adam_step_

#: Where the options are set: ``optimizer:`` in a model's ``init_args``.
OPTION = "model.optimizer"


#: ``lr_decay``'s shapes: the share of ``lr - lr_end`` left at ``progress`` (0 to 1) through a period.
DECAYS: dict[str, Callable[[float], float]] = {
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1.0 - progress,
}

#: The optimizers of ``algorithm``.
ALGORITHMS = ("adam", "rmsprop", "rmsprop_tf")


@dataclass(frozen=True)
class OptimizerOptions:
    """The optimizer of an agent's update and its learning-rate schedule: ``optimizer:`` in a model's ``init_args``
    (``--model.init_args.optimizer.lr 3e-4``). Each agent's default instance holds its own defaults.

    Args:
        algorithm: ``adam`` (fused; AdamW with ``weight_decay``), ``rmsprop`` (PyTorch's, A2C's optimizer in its
            paper and in Stable-Baselines3, the RL Zoo's ``use_rms_prop``) or ``rmsprop_tf`` (TensorFlow's RMSprop,
            :class:`TFLikeRMSprop`: Stable-Baselines3's ``RMSpropTFLike``, which the RL Zoo's Atari A2C steps with).
        lr: learning rate (at frame 0, when ``lr_end`` is set).
        lr_end: with a value, the learning rate follows a cosine from ``lr`` at frame 0 to ``lr_end`` at ``lr_frames``
            frames, and stays there; None: constant ``lr``. In frames, like ε, so that a run's schedule does not
            depend on the machine's speed or the replay ratio.
        lr_frames: frames over which the decay runs (its first period, with ``lr_restart_mult``).
        lr_decay: the decay's shape from ``lr`` to ``lr_end``: ``cosine``, or ``linear`` (Stable-Baselines3's and the
            RL Zoo's ``lin_`` schedules, which fall linearly to 0 over the run).
        lr_restart_mult: with a value, the cosine restarts at ``lr`` after each period, each period this many times
            longer than the one before (SGDR's warm restarts, Loshchilov & Hutter 2017: PyTorch's
            ``CosineAnnealingWarmRestarts(T_0, T_mult)`` with ``T_0 = lr_frames`` counted in frames, ``eta_min =
            lr_end``); None: one period, then ``lr_end`` from there on.
        weight_decay: decoupled weight decay (AdamW, Loshchilov & Hutter 2019); 0: plain Adam.
        eps: the ε added to the root of the second-moment estimate (PyTorch's default 1e-8; Stable-Baselines3's
            PPO and A2C, and CleanRL's PPO, use 1e-5: A2C's ``rms_prop_eps``).
        betas: Adam's decay rates of the gradient's first and second moment estimates (PyTorch's default 0.9, 0.999;
            Stable-Baselines3 contrib's CrossQ: 0.5, 0.999).
        alpha: RMSprop's smoothing constant of the squared gradients' average (PyTorch's and Stable-Baselines3's
            0.99; both RMSprops); unused by Adam.
        max_grad_norm: clip the gradients' global L2 norm to this before each step; None: no clipping.
            ``--trainer.gradient_clip_val`` is handed to this by the CLI: Lightning clips only in its automatic
            optimization, and the update here is the agent's own.
        accumulate_grad_batches: batches whose gradients one update sums before its optimizer step, each batch's
            loss divided by their number: the update of one batch that many times larger, in pieces (the Mario
            reference's 4 × 512). ``--trainer.accumulate_grad_batches`` is handed to this by the CLI.
    """

    lr: float = 1e-3
    algorithm: Literal["adam", "rmsprop", "rmsprop_tf"] = "adam"
    lr_end: float | None = None
    lr_frames: int = 1_000_000
    lr_restart_mult: float | None = None
    lr_decay: str = "cosine"
    weight_decay: float = 0.0
    eps: float = 1e-8
    betas: tuple[float, float] = (0.9, 0.999)
    alpha: float = 0.99
    max_grad_norm: float | None = None
    accumulate_grad_batches: int = 1

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"{OPTION}.lr must be > 0, got {self.lr}")
        if self.lr_end is not None and not 0 <= self.lr_end <= self.lr:
            raise ValueError(
                f"{OPTION}.lr_end must be in [0, lr={self.lr}] (or null for a constant lr), got {self.lr_end}"
            )
        if self.lr_frames < 1:
            raise ValueError(f"{OPTION}.lr_frames must be >= 1, got {self.lr_frames}")
        if self.lr_decay not in DECAYS:
            raise ValueError(f"{OPTION}.lr_decay must be one of {', '.join(DECAYS)}, got {self.lr_decay!r}")
        if self.lr_restart_mult is not None and not self.lr_restart_mult >= 1:
            raise ValueError(f"{OPTION}.lr_restart_mult must be >= 1 (or null), got {self.lr_restart_mult}")
        if self.lr_restart_mult is not None and self.lr_end is None:
            raise ValueError(f"{OPTION}.lr_restart_mult restarts the cosine to lr_end: set lr_end too")
        if self.weight_decay < 0:
            raise ValueError(f"{OPTION}.weight_decay must be >= 0, got {self.weight_decay}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"{OPTION}.algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if len(self.betas) != 2 or not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"{OPTION}.betas must be two numbers in [0, 1), got {list(self.betas)}")
        object.__setattr__(self, "betas", tuple(self.betas))
        if not 0 <= self.alpha < 1:
            raise ValueError(f"{OPTION}.alpha must be in [0, 1), got {self.alpha}")
        if not self.eps > 0:
            raise ValueError(f"{OPTION}.eps must be > 0, got {self.eps}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"{OPTION}.max_grad_norm must be > 0 (or null for no clipping), got {self.max_grad_norm}")
        if self.accumulate_grad_batches < 1:
            raise ValueError(f"{OPTION}.accumulate_grad_batches must be >= 1, got {self.accumulate_grad_batches}")

    def learning_rate(self, frames: int) -> float:
        """The learning rate after ``frames`` frames: ``lr``, or its decay (``lr_decay``) to ``lr_end`` over
        ``lr_frames`` (restarting, with ``lr_restart_mult``)."""
        if self.lr_end is None:
            return self.lr
        if self.lr_restart_mult is None:
            progress = min(frames / self.lr_frames, 1.0)
        else:  # find the period `frames` falls in
            start, period = 0.0, float(self.lr_frames)
            while frames >= start + period:
                start, period = start + period, period * self.lr_restart_mult
            progress = (frames - start) / period
        return self.lr_end + (self.lr - self.lr_end) * DECAYS[self.lr_decay](progress)

    def build(self, groups: list[dict]) -> torch.optim.Optimizer:
        """The optimizer on parameter ``groups``: a fused Adam (AdamW with ``weight_decay``), or RMSprop (PyTorch's
        or TensorFlow's); a group without ``lr`` takes ``lr``."""
        for group in groups:
            group.setdefault("lr", self.lr)
            group["base_lr"] = group["lr"]  # what lr_end's schedule scales (kept in the optimizer's checkpoint)
        if self.algorithm == "rmsprop":
            return torch.optim.RMSprop(
                groups, lr=self.lr, alpha=self.alpha, eps=self.eps, weight_decay=self.weight_decay, foreach=True
            )
        if self.algorithm == "rmsprop_tf":
            return TFLikeRMSprop(groups, lr=self.lr, alpha=self.alpha, eps=self.eps, weight_decay=self.weight_decay)
        # The fused kernel updates every parameter in one op: on a small network, whose step is mostly per-op overhead,
        # it is several times faster than the default implementation (docs/results/snake.md, "The update against its
        # bare arithmetic").
        if self.weight_decay:
            return torch.optim.AdamW(
                groups, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay, eps=self.eps, fused=True
            )
        return torch.optim.Adam(groups, lr=self.lr, betas=self.betas, eps=self.eps, fused=True)


class TFLikeRMSprop(torch.optim.Optimizer):
    """RMSprop as TensorFlow computes it: Stable-Baselines3's ``RMSpropTFLike`` (from OpenAI Baselines' A2C), which
    the RL Zoo's A2C entry for Atari steps with, and which Stable-Baselines3 advises for a stabler A2C than with
    PyTorch's RMSprop. Two differences from PyTorch's: ε is added inside the square root,
    ``p -= lr · g / √(v + ε)`` (PyTorch's: ``g / (√v + ε)``), and the running average ``v`` of the squared gradients
    starts at 1, not 0, so a first step is about ``lr · g`` where PyTorch's is ``10 · lr · sign(g)`` (α 0.99). No
    momentum, not centred (the Zoo's use); ``weight_decay`` adds ``weight_decay · p`` to the gradient, as both do.
    """

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                grad = parameter.grad
                if group["weight_decay"]:
                    grad = grad.add(parameter, alpha=group["weight_decay"])
                state = self.state[parameter]
                if not state:
                    state["step"] = 0
                    state["square_avg"] = torch.ones_like(parameter, memory_format=torch.preserve_format)
                state["step"] += 1
                square_avg = state["square_avg"]
                square_avg.mul_(group["alpha"]).addcmul_(grad, grad, value=1 - group["alpha"])
                parameter.addcdiv_(grad, square_avg.add(group["eps"]).sqrt_(), value=-group["lr"])
        return loss


class FusedAdamStep:
    """``clip_grad_norm_(max_grad_norm)`` + ``optimizer.step()`` + ``zero_grad(set_to_none=True)``, same arithmetic.

    The direct path makes one fused call per parameter group, each with its group's learning rate. The optimizer's
    own ``step()`` runs whenever it does not apply: an optimizer other than a fused Adam without AMSGrad, the steps
    until every parameter has its state, or a group with only some of its gradients. A group with none is skipped,
    as Adam's own step skips each parameter without a gradient.

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
        given = [grad for grad in grads if grad is not None]
        if self.max_grad_norm is not None and given:
            clip_grads_by_global_norm_(given, self.max_grad_norm)  # clip_grads_with_norm_'s arithmetic
        groups = self._groups_with_gradients(grads)
        if groups is None:
            self.optimizer.step()
            self._state = self._bind_state() if self.direct else None
        else:
            for group, group_grads, (exp_avgs, exp_avg_sqs, steps) in groups:
                beta1, beta2 = group["betas"]
                fused_adam_step_(
                    group["params"],
                    group_grads,
                    exp_avgs,
                    exp_avg_sqs,
                    steps,
                    lr=group["lr"],  # read every step: a scheduler may change it
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                )
        for p in self.params:
            p.grad = None

    def _groups_with_gradients(self, grads: list[torch.Tensor | None]) -> list[tuple[dict, list, tuple]] | None:
        """The groups the direct path steps, each with its gradients and state: those whose parameters all have a
        gradient. A group with none is left alone, as Adam's own step leaves every parameter without a gradient (TD3's
        and CrossQ's actor between its delayed updates). None: the optimizer's own step is due (no bound state yet, or
        a group with only some of its gradients)."""
        if self._state is None:
            return None
        groups, start = [], 0
        for group, state in zip(self.optimizer.param_groups, self._state, strict=True):
            group_grads = grads[start : start + len(group["params"])]
            start += len(group["params"])
            missing = sum(grad is None for grad in group_grads)
            if missing == 0:
                groups.append((group, group_grads, state))
            elif missing < len(group_grads):
                return None
        return groups

    def _bind_state(self) -> list[tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]] | None:
        # After the optimizer's own step, so that the state is the one a resume loaded; None while a parameter has
        # none yet (it has had no gradient so far).
        if any(not self.optimizer.state.get(p) for p in self.params):
            return None
        bound = []
        for group in self.optimizer.param_groups:
            state = [self.optimizer.state[p] for p in group["params"]]
            bound.append(([s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state], [s["step"] for s in state]))
        return bound
