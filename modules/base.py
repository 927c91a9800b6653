"""RLModule: what every agent shares — the acting policies, the update step, loss assembly and logging.

The update is one unit: loss, backward, gradient clip, optimizer step (and the agent's target-network update), run
by ``training_step`` under Lightning's manual optimization. With ``compile`` the loss and its backward graph are
compiled the way TorchRL's sota-implementations compile theirs (``torch.compile``), which removes most of the Python
cost of TorchRL's loss modules; the clip and the Adam step are PyTorch's fused kernels called directly
(:mod:`modules.optim`), compiled or not. What that leaves of the framework's cost is measured against the update's
bare arithmetic by ``benchmarks/update_cost.py`` (docs/results/snake.md, "The update against its bare arithmetic").
"""

from __future__ import annotations

import functools
import math
import operator
import re
import time
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import CudaGraphModule, TensorDictModuleBase
from torch import nn
from torch.nn.parameter import is_lazy
from torchrl.data import TensorSpec
from torchrl.envs import Transform

from checkpoints.files import CheckpointMismatch
from compat.lightning import (
    backward_is_plain,
    checkpoint_step_intervals,
    count_batches_stepped,
    optimizer_step_with_hooks,
)
from compat.tensordict import install_from_any_tensor_shortcut
from compat.torch import (
    foreach_copy_,
    foreach_lerp_,
    inductor_fallback_random,
    inductor_mode_options,
    probe_cpu_vector_isa_early,
)
from datamodules.source import DataSource
from modules.optim import FusedAdamStep, OptimizerOptions

# training_step takes the dataloader iterator on purpose (see RLModule.training_step); Lightning flags that
# signature as experimental on every run.
warnings.filterwarnings("ignore", message=".*`dataloader_iter` argument in the `training_step`.*")
warnings.filterwarnings("ignore", message=".*You are using the `dataloader_iter` step flavor.*")
# Every TensorDictModule call (acting, every loss) writes its outputs through TensorDict.from_any
# (compat/tensordict.py).
install_from_any_tensor_shortcut()


_ON_MODEL = re.compile(r"\bself\b")  # a guard whose source mentions the model


def _batch_guards(entries: list[Any]) -> list[bool]:
    """Which of Dynamo's guards the compiled loss keeps: all but those on the model (``self``: its modules,
    parameters and attributes, hundreds for a TorchRL loss module) and on globals, and of tensor guards all but those
    on parameters. Kept: each batch tensor's shape, dtype, stride and device, the batch's key sets, and whatever
    decides the function's Python control flow from its arguments — also in the functions Dynamo resumes after a graph
    break, where a local that is None in one run and a tensor in another (prioritized replay's weights) must not reuse
    the other run's graph. Dynamo caches compiled code per code object, so each model compiles a copy of its function's
    (:func:`own_code`): dropped guards never let one model replay another's graph."""
    return [
        not isinstance(entry.value, nn.Parameter)
        if entry.guard_type == "TENSOR_MATCH"
        else not (_ON_MODEL.search(entry.name) or entry.name.startswith("G["))
        for entry in entries
    ]


def own_code(function: Callable) -> Callable:
    """``function`` (a method, or a plain function) over a copy of its code object. Dynamo caches compiled code per
    code object, and :func:`_batch_guards` drops the guards on the model: with the code shared, another model in the
    same process (a notebook, a test, a search) replayed the first one's graph, its parameter shapes and its options
    baked in (another PPO's entropy weight of 0 detached this one's entropy term; test_lightning_features.py). A copy
    per model keeps each model's graphs its own."""
    method = function if isinstance(function, types.MethodType) else None
    plain = method.__func__ if method is not None else function
    copy = types.FunctionType(
        plain.__code__.replace(), plain.__globals__, plain.__name__, plain.__defaults__, plain.__closure__
    )
    copy.__kwdefaults__, copy.__qualname__ = plain.__kwdefaults__, plain.__qualname__
    return types.MethodType(copy, method.__self__) if method is not None else copy


#: ``compile``'s string values: torch.compile's modes, and cudagraph (compiled, and on CUDA the whole update graphed).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "cudagraph")


class RLModule(pl.LightningModule):
    """Base class of the agents.

    An agent builds its networks and TorchRL loss from the specs the CLI links in from the data module, and
    implements :meth:`policy` (acting, with exploration), :meth:`greedy_policy` (evaluation and export),
    :meth:`update` (its algorithm's update, written with the services here: :meth:`loss_backward`,
    :meth:`optimizer_step`, :meth:`replay_graph`, :meth:`soft_update`) and, when its loss is not a plain TorchRL loss
    module call, :meth:`loss`. The data module does all environment stepping; :meth:`training_step` fetches the
    batches, runs the update, checks its loss (:meth:`check_finite`) and logs it (:meth:`log_update`).

    Args:
        observation_spec: observation spec of one environment (linked from ``data.observation_spec``).
        action_spec: action spec of one environment (linked from ``data.action_spec``).
        optimizer: the Adam optimizer, its learning-rate schedule, gradient clipping and accumulation
            (:class:`~modules.optim.OptimizerOptions`; ``optimizer: {lr: 3e-4, max_grad_norm: 0.5}`` in a config).
        compile: ``False``, ``True`` or a ``torch.compile`` mode (``"default"``, ``"reduce-overhead"``,
            ``"max-autotune"``): compile the loss with its backward. The first updates then take seconds each while
            they compile. ``"cudagraph"``: compile it, and on a CUDA device capture the whole update (loss, backward,
            clip, fused Adam step) as one CUDA graph that each later update replays (tensordict's
            ``CudaGraphModule``: a few warm-up updates run eagerly, then one is captured); on a CPU it is ``True``.
            Refused where a replayed graph could not do what the eager update does (see :meth:`check_datamodule`).
        check_finite_every: updates between checks that the loss is finite. Each check is one host sync on GPU.
    """

    #: Whether the backward skips Lightning's calls around it (set at fit start, :func:`backward_is_plain`); an update
    #: taken outside fit goes through Lightning.
    _plain_backward = False

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        optimizer: OptimizerOptions = OptimizerOptions(),
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__()
        # The update is the model's own unit (see the module docstring), so Lightning does not drive the optimizer.
        self.automatic_optimization = False
        if check_finite_every < 1:
            raise ValueError(f"model.check_finite_every must be >= 1, got {check_finite_every}")
        if not isinstance(compile, bool) and compile not in COMPILE_MODES:
            raise ValueError(f"model.compile must be true, false, {', '.join(COMPILE_MODES)}, got {compile}")
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.optim = optimizer
        self.compile_mode = compile
        if compile and not torch.cuda.is_available():  # the compiled update will run on this CPU
            probe_cpu_vector_isa_early()
        self.check_finite_every = check_finite_every
        self._compiled_loss: Callable[[TensorDictBase], TensorDictBase] | None = None  # set in on_fit_start
        self._graphed_update: CudaGraphModule | None = None  # compile: cudagraph on a CUDA device
        self._optimizer_step: FusedAdamStep | None = None
        self._lightning_optimizer: Any = None

    # ------------------------------------------------------------------------------------------ agent interface
    def policy(self) -> TensorDictModuleBase:
        """The acting policy the collector runs (with exploration)."""
        raise NotImplementedError

    def greedy_policy(self) -> TensorDictModuleBase:
        """The policy without exploration: evaluation and export."""
        raise NotImplementedError

    def export_network(self) -> nn.Module:
        """The policy's network as a plain module, ``observation [batch, *obs_shape] -> [batch, num_actions]``.

        This is what :class:`~callbacks.export.PolicyExport` traces: tensors in and out, no TensorDict, so that
        TorchScript, ``torch.export`` and ``torch_neuronx.trace`` all accept it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define export_network()")

    #: In-place work on each collected batch before it is used (PPO: advantages), or None.
    postprocess: Callable[[TensorDictBase], None] | None = None

    def batch_keys(self) -> list[NestedKey]:
        """The entries the update reads from a batch: a replay buffer keeps only these."""
        return list(self.loss_module.in_keys)

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """TensorDict whose ``loss_*`` entries are summed into the training loss."""
        return self.loss_module(batch)

    def update(self, batches: list[TensorDictBase]) -> tuple[torch.Tensor, TensorDictBase]:
        """One update on ``batches`` (``accumulate_grad_batches`` of them): the agent's algorithm, written with the
        services below (:meth:`loss_backward`, :meth:`optimizer_step`, :meth:`replay_graph`, :meth:`soft_update`) and
        ending with ``self.datamodule.after_update(priorities)``. Returns the detached total loss and the loss terms
        to log; :meth:`training_step` times it, checks the loss is finite and logs (:meth:`check_finite`,
        :meth:`log_update`)."""
        raise NotImplementedError(f"{type(self).__name__} does not define update()")

    # ---------------------------------------------------------------------------------------- Lightning hooks
    @property
    def datamodule(self) -> DataSource:
        """Where the batches come from: all an agent may ask of its data module (:class:`DataSource`)."""
        return self.trainer.datamodule

    #: Whether a compiled update on the CPU runs in Inductor's C++ wrapper (below); an agent whose graphs it cannot
    #: build sets False.
    cpp_wrapper = True

    def compiled(self, function: Callable) -> Callable:
        """``function`` compiled with the ``compile`` option's mode, or ``function`` itself when compile is off.

        Compiling a function rather than the networks in place keeps parameter names, and so checkpoints, those of
        the eager networks, and leaves the acting and evaluation policies (other batch sizes) eager.
        """
        if not self.compile_mode:
            return function
        # Random ops inside the update (SAC's sampled actions) draw from the global generator as in eager, so a
        # compiled run takes the same random numbers as an eager one and checkpoints' RNG states mean the same.
        inductor_fallback_random()
        mode = "default" if self.compile_mode in (True, "cudagraph") else self.compile_mode
        # Before each call Dynamo checks guards on everything the function touched, which for a TorchRL loss module is
        # hundreds of attribute and parameter guards: a noticeable share of a small network's update
        # (docs/history/snake.md, "The update against its bare arithmetic: from the first figures to the current ones").
        # The update calls the loss with the same code, modules and flags every time, so the guards on the model are
        # dropped (_batch_guards): a batch of another shape, or with other entries, still recompiles.
        options = {**inductor_mode_options(mode), "guard_filter_fn": _batch_guards}
        if self.device.type == "cpu" and self.cpp_wrapper:
            # Inductor's default wrapper is Python: between two of the graph's kernels it returns to the interpreter
            # and takes the GIL back, and while a prefetch thread holds the GIL (its collection is mostly Python) the
            # update waits. The C++ wrapper runs the whole graph without the interpreter, which makes the update faster
            # beside a prefetch thread and alone, for slightly longer compilation (docs/history/snake.md, "The update
            # against its bare arithmetic: what changed before the current figures of 2026-11-25").
            options["cpp_wrapper"] = True
        # dynamic=False: every update sees the same batch shape, and its graph is static whatever else this process
        # compiled. Without it Dynamo's automatic dynamic shapes key what they saw by the function's file, line and
        # name, so a model compiled after another model's loss of another batch size would compile a dynamic graph,
        # whose numbers differ from a fresh process's in the last bits (a resumed run would not log what the
        # uninterrupted one did). It sets and restores two of Dynamo's settings around each call, about 1 % of a small
        # update (docs/history/gymnasium.md, "Compiled updates: dynamic=False kept").
        return torch.compile(own_code(function), options=options, dynamic=False)

    def compiled_loss(self) -> Callable[[TensorDictBase], TensorDictBase]:
        """What an update computes its loss with: :meth:`loss`, compiled with ``compile`` (an agent that compiles
        part of its loss, or another function, says so here)."""
        return self.compiled(self.loss)

    def check_datamodule(self, datamodule: DataSource, cannot_capture: tuple[str, ...] = ()) -> None:
        """Raise a ValueError naming the flag when this model cannot train on ``datamodule`` (the CLI calls this right
        after building both, so the error comes before any output folder exists; ``setup`` calls it again for a
        Trainer driven directly). Agents extend it, and pass what of their update a CUDA graph cannot replay
        (``cannot_capture``, for ``compile: cudagraph``'s one-line refusal)."""
        if self.compile_mode == "cudagraph":
            self._check_cuda_graph(datamodule, cannot_capture)

    def check_random_update(self, datamodule: DataSource) -> None:
        """The checks of an update that draws random numbers and gives no priorities (SAC, TD3): a round collected
        beside it in another thread (``prefetch``) would draw from the same global generator in an order that changes
        from run to run, and prioritized replay would get nothing back."""
        if datamodule.prefetch:
            raise ValueError(
                f"data.collection.prefetch: {type(self).__name__}'s update draws random numbers, "
                "and a round collected beside it would draw from the same generator in an order that varies, so runs "
                "would not repeat; use prefetch false"
            )
        if datamodule.prioritized:
            raise ValueError(f"data.priority.alpha: {type(self).__name__} gives the replay buffer no priorities; use 0")

    def actor_critic_optimizer(self, actor_lr: float) -> torch.optim.Optimizer:
        """The fused Adam of an actor-critic (SAC, TD3): the actor's parameters (the loss module's
        ``actor_network_params``) at ``actor_lr``, the rest (the critics, SAC's log α) at ``optimizer.lr``."""
        actor = {id(p) for p in self.loss_module.actor_network_params.values(True, True)}
        parameters = self.trainable_parameters()
        return self.optim.build(
            [
                {"params": [p for p in parameters if id(p) in actor], "lr": actor_lr},
                {"params": [p for p in parameters if id(p) not in actor]},
            ]
        )

    def _check_cuda_graph(self, datamodule: DataSource, cannot_capture: tuple[str, ...]) -> None:
        """Refuse ``compile: cudagraph`` where replaying one captured update would not do what the eager update
        does: whatever changes from one update to the next outside the batch's tensors is baked into the graph."""
        flag = "model.compile cudagraph"
        reasons = [
            (self.optim.accumulate_grad_batches > 1, "gradient accumulation (optimizer.accumulate_grad_batches 1)"),
            (self.optim.lr_end is not None, "a learning-rate schedule: the step's lr is captured once (lr_end null)"),
            (self.optim.weight_decay > 0, "AdamW's step, which is not capturable here (optimizer.weight_decay 0)"),
            (
                self.optim.algorithm != "adam",
                "RMSprop's step: the fused Adam is what it captures (optimizer.algorithm adam)",
            ),
            (datamodule.prioritized, "prioritized replay's priorities (priority.alpha 0)"),
            *((True, reason) for reason in cannot_capture),
        ]
        refused = [reason for cannot, reason in reasons if cannot]
        if refused:
            raise ValueError(f"{flag} cannot capture {'; '.join(refused)}: use compile true")

    def setup(self, stage: str) -> None:
        self.connect_datamodule(stage)

    def connect_datamodule(
        self, stage: str, env_transform: Transform | None = None, store_transform: Transform | None = None
    ) -> None:
        """Hand the data module what it collects with: ``env_transform``, a TorchRL transform every environment the
        policy acts in must carry (a recurrent policy's episode-start flag and state primer), at every stage; and when
        fitting, after :meth:`check_datamodule`, the acting policy, :attr:`postprocess`, :meth:`batch_keys` and
        ``store_transform``, a replay-buffer transform of the collected transitions (DQN's n-step returns)."""
        self.datamodule.use_env_transform(env_transform)
        if stage == "fit":
            self.check_datamodule(self.datamodule)
            self.datamodule.connect(self.policy(), self.postprocess, self.batch_keys(), store_transform)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates (target networks are buffers of the loss module, not parameters)."""
        return [parameter for parameter in self.loss_module.parameters() if parameter.requires_grad]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optim.build([{"params": self.trainable_parameters()}])

    def on_fit_start(self) -> None:
        if isinstance(self.trainer.precision_plugin, MixedPrecision) and self.trainer.precision_plugin.scaler:
            raise ValueError(
                f"--trainer.precision {self.trainer.precision}: a gradient scaler is not supported by the model's "
                "own update step; use bf16-mixed (same speed on GPUs with bf16 tensor cores, no scaler needed)"
            )
        # The updates a Lightning step ends after: logging steps (the trainer's, and a callback's own, as the
        # throughput report's rates), and those a step-scheduled ModelCheckpoint saves at.
        self._log_every = self.trainer.log_every_n_steps  # read once an update by log_update
        logging = [self._log_every, *callback_intervals(self.trainer, "log_every_n_steps")]
        self._step_ends = [*logging, *checkpoint_step_intervals(self.trainer)]
        # The frame intervals callbacks act at (evaluations, checkpoints, videos), and whether a step may go on to
        # rounds it collects itself (training_step).
        self._frame_ends = callback_intervals(self.trainer, "every_n_frames")
        self._rounds_join_steps = rounds_may_join_steps(self.trainer)
        self._plain_backward = backward_is_plain(self.trainer, self)  # else through Lightning (loss_backward)
        # Lightning's wrapper keeps the step bookkeeping; the step itself runs the fused kernels on its optimizer.
        self._lightning_optimizer = self.optimizers()
        self._optimizer_step = FusedAdamStep(self._lightning_optimizer.optimizer, self.optim.max_grad_norm)
        # TorchRL fills a loss's input keys on first use; doing it before compiling spares one recompilation.
        _ = self.loss_module.in_keys
        self._compiled_loss = self.compiled_loss()
        if self.compile_mode == "cudagraph" and self.device.type == "cuda":
            if self.trainer.world_size > 1:
                raise ValueError("model.compile cudagraph: not with DDP (the all-reduce runs in hooks)")
            # Two eager warm-up updates (compilation, the optimizer's state), then one captured; the rest replay it.
            self._graphed_update = CudaGraphModule(self._captured_update, warmup=3, in_keys=[], out_keys=[])

    def follow_frames(self) -> None:
        """Set what follows the frame counter (the learning rate's schedule; subclasses: DQN's ε, SAC's BC weight):
        once the step's collection, if it had one, is counted, so the step's updates, the next collection and a
        checkpoint written after the step all see the values of the frames collected so far."""
        if self.optim.lr_end is not None:
            factor = self.optim.learning_rate(self.datamodule.frames) / self.optim.lr
            for group in self._lightning_optimizer.optimizer.param_groups:
                group["lr"] = group["base_lr"] * factor

    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:
        """The updates whose batches are ready. The batches are fetched here, not by Lightning, so that nothing is
        collected ahead of the weights: Lightning's default loop prefetches the next batch, which would step the
        environments with a policy one update stale and put that extra collection inside the checkpoint a resumed run
        starts from. With ``accumulate_grad_batches`` k, an update fetches and accumulates k batches.

        One Lightning step also takes every further update the data module has batches ready for without collecting
        (``batches_ready``: the rest of a replay round, whose batches a collection earns together, or of a rollout's
        minibatches), and then further rounds it collects itself, for up to :data:`STEP_SECONDS` (small rounds of one
        update each, a frame of SAC's or a rollout of A2C's): Lightning's own per-step work (its loop, hooks, logger
        connector and data fetcher; docs/history/snake.md, "The update against its bare arithmetic: from the first
        figures to the current ones") is then paid once for them. Such a step still ends at a logging step, at a step
        a ``ModelCheckpoint(every_n_train_steps=N)`` saves at, at ``max_steps``, after a round that reached a frame a
        callback acts at (``every_n_frames``), and at a stop, so every callback sees what it would after one round a
        step, and ``global_step`` counts updates.
        """
        updates_before, frames_before, started = self.global_step, self.datamodule.frames, time.perf_counter()
        fetch = lambda: next(dataloader_iter)[0]  # noqa: E731
        while True:
            # The step's first batches come through Lightning's iterator (which starts the data module's stream and
            # collects when nothing is ready), a further round's from the data module directly; the rest of a round's
            # are the data module's, already drawn.
            batches = [fetch() for _ in range(self.optim.accumulate_grad_batches)]
            fetch = self.datamodule.next_batch
            self.follow_frames()
            while True:
                loss = self._update_and_log(batches)
                if not self._next_update_in_this_step():
                    break
                batches = [self.datamodule.next_ready_batch() for _ in range(self.optim.accumulate_grad_batches)]
            if not self._next_round_in_this_step(frames_before, started):
                break
        # Lightning counts one "batch that stepped" per training_step and logs metrics at that count: keep it equal to
        # the update count (metrics.csv's step column, and the logging steps, in updates as before).
        count_batches_stepped(self.trainer, self.global_step - updates_before - 1)
        return loss

    def _step_ends_here(self) -> bool:
        """Whether this Lightning step ends after the update just taken: a stop is due (SIGTERM included), or it has
        reached ``max_steps``, a logging step (Lightning writes the logged metrics at the end of the step) or a step a
        step-scheduled ``ModelCheckpoint`` saves at."""
        update, trainer = self.global_step, self.trainer
        if trainer.should_stop or trainer.received_sigterm:  # SIGTERM: stop after this update
            return True
        if trainer.max_steps >= 0 and update >= trainer.max_steps:
            return True
        return any(every > 0 and update % every == 0 for every in self._step_ends)

    def _next_update_in_this_step(self) -> bool:
        """Whether the next update joins this Lightning step: its batches are ready without collecting, and the step
        does not end here (:meth:`_step_ends_here`)."""
        ready = self.datamodule.batches_ready >= self.optim.accumulate_grad_batches
        return ready and not self._step_ends_here()

    def _next_round_in_this_step(self, frames_before: int, started: float) -> bool:
        """Whether this step, having taken every update its rounds had ready, collects the next round too: on one
        rank, with callbacks that all keep their schedules this way (:func:`rounds_may_join_steps`), within
        :data:`STEP_SECONDS` of the step's start, where the step does not end (:meth:`_step_ends_here`), and with no
        frame a callback acts at reached since the step began (``frames_before``)."""
        if not self._rounds_join_steps or time.perf_counter() - started > STEP_SECONDS or self._step_ends_here():
            return False
        frames = self.datamodule.frames
        return all(frames // every == frames_before // every for every in self._frame_ends)

    def _update_and_log(self, batches: list[TensorDictBase]) -> torch.Tensor:
        """The agent's :meth:`update` on ``batches`` (timed), its finiteness check, and its metrics."""
        update = self.global_step  # the index of this update; global_step counts it once the step is taken
        with self.datamodule.timer.phase("update"):
            loss, losses = self.update(batches)
        self.check_finite(loss, update)
        self.log_update(loss, losses, update, batches[-1].numel())
        return loss

    def check_finite(self, loss: torch.Tensor, update: int) -> None:
        """Stop training on a loss that is not finite (every ``check_finite_every`` updates: each check is one host
        sync on a GPU)."""
        # One host read of the loss (a sync on a GPU, as any check there): a few kernels of `torch.isfinite` cost a
        # small update's loop more than the read.
        if update % self.check_finite_every == 0 and not math.isfinite(loss.item()):
            raise FloatingPointError(
                f"the training loss is {loss.item()} at update {update} ({self.datamodule.frames} frames): training "
                "stopped, and no checkpoint was written since, so the last checkpoint holds the last good weights"
            )

    def log_update(self, loss: torch.Tensor, losses: TensorDictBase, update: int, batch_size: int) -> None:
        """The update's loss terms, :meth:`extra_metrics` and the data module's monitor, on logging steps only."""
        # Lightning writes metrics every `log_every_n_steps` steps, but each self.log call costs its Python overhead
        # whether written or not: on a loop of thousands of small updates a second, log only what is written.
        if (update + 1) % self._log_every != 0:
            return
        metrics = {f"train/{key}": value.detach() for key, value in losses.items() if value.numel() == 1}
        metrics.pop("train/loss", None)
        if "td_error" in losses:  # per sample (prioritized replay's priorities): logged as its mean
            metrics["train/td_error"] = losses["td_error"].detach().mean()
        metrics.update(self.extra_metrics())
        metrics.update(self.datamodule.monitor())
        if self.optim.lr_end is not None:
            metrics["train/lr"] = self._lightning_optimizer.optimizer.param_groups[0]["lr"]
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        self.log_dict(metrics, batch_size=batch_size)

    # ------------------------------------------------------------------------ the update's shared services
    @staticmethod
    def loss_sum(losses: TensorDictBase, held: frozenset[str] = frozenset()) -> torch.Tensor:
        """The training loss: the sum of the ``loss_*`` terms, but those ``held`` back (computed, not trained on)."""
        # Summed from the first term, not from 0 as `sum` starts: `0 + loss` is one more kernel and one more node for
        # the backward to walk, on every update (a single term, DQN's, is then the loss itself, to the bit).
        terms = [value for key, value in losses.items() if key.startswith("loss") and key not in held]
        return functools.reduce(operator.add, terms)

    def loss_backward(
        self,
        batches: list[TensorDictBase],
        loss_inputs: Callable[[TensorDictBase], dict[str, Any]] | None = None,
        held: frozenset[str] = frozenset(),
        loss: Callable[..., TensorDictBase] | None = None,
    ) -> tuple[torch.Tensor, TensorDictBase, torch.Tensor | None]:
        """The (compiled, with ``compile``) :meth:`loss` of each batch and its backward, each loss divided by their
        number so that the gradients sum to those of their mean (gradient accumulation). ``loss_inputs(batch)``: the
        loss's inputs beyond its batch (PIRL's collocation points), drawn eagerly before the compiled loss;
        ``held``: loss terms left out of the sum (:meth:`loss_sum`); ``loss``: another (compiled) loss function than
        the update's own, for an update that computes only part of it (TD3's critics between two actor updates).
        Returns the detached mean loss, the last batch's
        loss terms (not detached: a new TensorDict per update costs more than the few logged steps need) and the
        batches' per-sample ``td_error`` in the order they were served (prioritized replay's new priorities), or
        None when the loss gives none."""
        total, td_errors = None, []
        compute = self._compiled_loss if loss is None else loss
        for batch in batches:
            losses = compute(batch, **(loss_inputs(batch) if loss_inputs is not None else {}))
            # Outside the compiled function, so that holding a term back never selects a stale compiled graph.
            loss = self.loss_sum(losses, held)
            # Through Lightning where it does something around the backward (DDP's gradient all-reduce, a callback's
            # backward hooks; with DDP every accumulated backward all-reduces: correct, if not the cheapest).
            scaled = loss if len(batches) == 1 else loss / len(batches)
            scaled.backward() if self._plain_backward else self.manual_backward(scaled)
            total = loss.detach() if total is None else total + loss.detach()
            td_errors.append(losses.get("td_error", None))
        priorities = None if td_errors[0] is None else td_errors[0] if len(batches) == 1 else torch.cat(td_errors)
        return total if len(batches) == 1 else total / len(batches), losses, priorities

    def optimizer_step(self) -> None:
        """Gradient clip (``max_grad_norm``) and Adam step as PyTorch's fused kernels (:mod:`modules.optim`)."""
        # Lightning's own bookkeeping around a step (global_step, the profiler), the calls LightningOptimizer.step
        # makes, without its closure machinery, so that the step itself is the fused kernels (modules/optim.py).
        optimizer_step_with_hooks(self._lightning_optimizer, self._optimizer_step)

    @property
    def graphed(self) -> bool:
        """Whether the update replays a captured CUDA graph (``compile: cudagraph`` on a CUDA device)."""
        return self._graphed_update is not None

    def replay_graph(self, batch: TensorDictBase) -> TensorDictBase:
        """``compile: cudagraph``: loss, backward, clip and fused Adam step of ``batch`` as one replayed CUDA graph
        (:meth:`_captured_update`). Returns the detached loss terms, with the total as ``loss``."""
        # The batch is copied into the graph's inputs, and the graph replayed, as the optimizer's step.
        return optimizer_step_with_hooks(self._lightning_optimizer, lambda: self._graphed_update(batch))

    def _captured_update(self, batch: TensorDictBase) -> TensorDictBase:
        """The update ``compile: cudagraph`` captures: loss, backward, clip and fused Adam step, nothing that reads
        a value back to the host. Its detached loss terms come out as a TensorDict (the graph's static outputs)."""
        losses = self._compiled_loss(batch)
        loss = self.loss_sum(losses)
        loss.backward()  # not manual_backward: its Python hooks would run once, at capture (DDP is refused)
        self._optimizer_step()
        terms = {key: value.detach() for key, value in losses.items() if key != "loss"}
        return TensorDict({**terms, "loss": loss.detach()}, batch_size=[])

    #: The loss module's networks that have target copies (``<name>_params`` and ``target_<name>_params``), for
    #: :meth:`soft_update` and :meth:`hard_update`.
    target_networks: tuple[str, ...] = ()

    def soft_update(self) -> None:
        """Polyak averaging of the :attr:`target_networks`, ``target ← (1 − τ)·target + τ·online`` with ``self.tau``:
        TorchRL's ``SoftUpdate`` arithmetic as one fused op. Its Python loop of one lerp per parameter was a noticeable
        share of a small network's update (docs/results/snake.md, "The update against its bare arithmetic")."""
        pairs = getattr(self, "_soft_pairs", None)
        if pairs is None:  # built on first use, after the model has reached its device
            # BatchNorm's batch counter is an integer: not averaged
            pairs = self._soft_pairs = self._target_pairs(lambda entry: entry.is_floating_point())
        foreach_lerp_(*pairs, self.tau)

    def hard_update(self) -> None:
        """The :attr:`target_networks`' target parameters set to the online ones: TorchRL's ``HardUpdate.step``, which
        copies the trainable parameters (not BatchNorm's statistics), as one fused copy. Its walk over the parameters'
        tensordicts took about a millisecond a copy, which a target copied every few dozen updates spreads over each
        of them (docs/history/gymnasium.md, "The acting network called layer by layer, and the target's copy
        fused")."""
        pairs = getattr(self, "_hard_pairs", None)
        if pairs is None:  # built on first use, after the model has reached its device
            pairs = self._hard_pairs = self._target_pairs(lambda entry: entry.requires_grad)
        foreach_copy_(*pairs)

    def _target_pairs(self, include: Callable[[torch.Tensor], bool]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The target and online tensors of the :attr:`target_networks`' entries that ``include`` accepts, in
        matching order."""
        targets, sources = [], []
        for name in self.target_networks:
            online = getattr(self.loss_module, f"{name}_params")
            target = getattr(self.loss_module, f"target_{name}_params")
            for key in online.keys(include_nested=True, leaves_only=True):
                if include(online.get(key)):
                    targets.append(target.get(key).data)
                    sources.append(online.get(key).data)
        return targets, sources

    def extra_metrics(self) -> dict[str, torch.Tensor | float]:
        """Agent-specific training metrics beyond the loss terms (ε, ...). Default: none."""
        return {}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """``python -m app validate``: greedy episodes in the evaluation environments."""
        metrics = self.datamodule.evaluate(self.greedy_policy())
        self.log_dict({f"eval/{key}": value for key, value in metrics.items()}, batch_size=1)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Before Lightning loads the weights: a checkpoint of another environment or network is one line saying what
        # differs, not the first tensor copy that fails deep inside the load.
        check_weights_fit(checkpoint.get("state_dict", {}), self.state_dict(), strict=self.strict_loading)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The specs are rebuilt from the config on load; pickled spec objects would not load with weights_only.
        checkpoint.get("hyper_parameters", {}).pop("observation_spec", None)
        checkpoint.get("hyper_parameters", {}).pop("action_spec", None)


#: How long a Lightning step goes on collecting rounds of its own (:meth:`RLModule.training_step`): a quarter of a
#: second, so that Lightning's per-step work is a small share of rounds of a few milliseconds (A2C's, SAC's), while the
#: progress bar moves a few times a second and ``max_time`` is passed by no more; a stop is seen at every update.
STEP_SECONDS = 0.25


def callback_intervals(trainer: pl.Trainer, name: str) -> list[int]:
    """The schedules ``name`` of the trainer's callbacks that keep one: ``every_n_frames`` (evaluations, videos,
    ``FrameCheckpoint``), ``log_every_n_steps`` (the throughput report's rates)."""
    intervals = (getattr(callback, name, None) for callback in trainer.callbacks)
    return [every for every in intervals if isinstance(every, int) and every > 0]


def rounds_may_join_steps(trainer: pl.Trainer) -> bool:
    """Whether one Lightning step may take several rounds it collects: on one rank (DDP's ranks keep their steps in
    step), and where every callback that acts at a step's end or start is one whose schedule such steps keep —
    Lightning's own (steps, time) and this project's (``callbacks/``: frames, steps, time) — not a callback of
    unknown schedule, which gets one round a step as before."""
    if trainer.world_size > 1:
        return False
    for callback in trainer.callbacks:
        hooks_steps = any(
            getattr(type(callback), hook) is not getattr(pl.Callback, hook)
            for hook in ("on_train_batch_end", "on_train_batch_start")
        )
        known = type(callback).__module__.split(".")[0] in ("lightning", "callbacks")
        if hooks_steps and not known:
            return False
    return True


def check_weights_fit(saved: dict[str, Any], own: dict[str, Any], strict: bool = True) -> None:
    """Raise :class:`~checkpoints.files.CheckpointMismatch` unless the weights ``saved`` in a checkpoint
    have the shapes of this model's (``own``) and, when ``strict``, the same entries."""
    for key, value in own.items():
        theirs = saved.get(key)
        if not isinstance(value, torch.Tensor) or not isinstance(theirs, torch.Tensor) or theirs.shape == value.shape:
            continue
        # Sized when first used (a lazy module's weights, a statistic's per-environment buffer): the load sizes it.
        if not is_lazy(value) and value.numel() > 0:
            raise CheckpointMismatch(
                f"its weights do not fit this config's model: {key} is {list(theirs.shape)} in the checkpoint and "
                f"{list(value.shape)} here (written for another environment or network?)"
            )
    if not strict:
        return
    missing, unexpected = sorted(own.keys() - saved.keys()), sorted(saved.keys() - own.keys())
    if missing or unexpected:
        parts = [f"{len(missing)} of this model's weights are not in it (first: {missing[0]})"] if missing else []
        parts += [f"it holds {len(unexpected)} this model has not (first: {unexpected[0]})"] if unexpected else []
        raise CheckpointMismatch(
            f"its weights do not fit this config's model: {'; '.join(parts)} (written for another agent or network?)"
        )
