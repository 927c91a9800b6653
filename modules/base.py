"""RLModule: what every agent shares — the acting policies, the update step, loss assembly and logging."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.data import TensorSpec

# training_step takes the dataloader iterator on purpose (see RLModule.training_step); Lightning flags that
# signature as experimental on every run.
warnings.filterwarnings("ignore", message=".*`dataloader_iter` argument in the `training_step`.*")


class RLModule(pl.LightningModule):
    """Base class of the agents.

    An agent builds its networks and TorchRL loss from the specs the CLI links in from the data module, and
    implements :meth:`policy` (acting, with exploration), :meth:`greedy_policy` (evaluation and export) and, when its
    loss is not a plain TorchRL loss module call, :meth:`loss`. The data module does all environment stepping.

    Args:
        observation_spec: observation spec of one environment (linked from ``data.observation_spec``).
        action_spec: action spec of one environment (linked from ``data.action_spec``).
        lr: learning rate of the Adam optimizer.
        compile: ``False``, ``True`` or a ``torch.compile`` mode (``"default"``, ``"reduce-overhead"``,
            ``"max-autotune"``) applied in place to the networks listed by :meth:`compiled_networks`.
        check_finite_every: updates between checks that the loss is finite. Each check is one host sync on GPU.
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: TensorSpec,
        lr: float = 1e-3,
        compile: bool | str = False,
        check_finite_every: int = 1,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"--model.init_args.lr must be > 0, got {lr}")
        if check_finite_every < 1:
            raise ValueError(f"--model.init_args.check_finite_every must be >= 1, got {check_finite_every}")
        if not isinstance(compile, bool) and compile not in (
            "default",
            "reduce-overhead",
            "max-autotune",
        ):
            raise ValueError(
                "--model.init_args.compile must be true, false, default, reduce-overhead or max-autotune, "
                f"got {compile}"
            )
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.lr = lr
        self.compile_mode = compile
        self.check_finite_every = check_finite_every

    # ------------------------------------------------------------------------------------------ agent interface
    def policy(self) -> TensorDictModuleBase:
        """The acting policy the collector runs (with exploration)."""
        raise NotImplementedError

    def greedy_policy(self) -> TensorDictModuleBase:
        """The policy without exploration: evaluation and export."""
        raise NotImplementedError

    def compiled_networks(self) -> list[nn.Module]:
        """The networks ``compile`` applies to."""
        return []

    def export_network(self) -> nn.Module:
        """The policy's network as a plain module, ``observation [batch, *obs_shape] -> [batch, num_actions]``.

        This is what :class:`~callbacks.export.PolicyExport` traces: tensors in and out, no TensorDict, so that
        TorchScript, ``torch.export`` and ``torch_neuronx.trace`` all accept it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define export_network()")

    #: In-place work on each collected batch before it is used (PPO: advantages), or None.
    postprocess: Callable[[TensorDictBase], None] | None = None

    def loss(self, batch: TensorDictBase) -> TensorDictBase:
        """TensorDict whose ``loss_*`` entries are summed into the training loss."""
        return self.loss_module(batch)

    def on_update(self) -> None:
        """Called after each optimizer step (target-network updates and the like)."""

    # ---------------------------------------------------------------------------------------- Lightning hooks
    @property
    def datamodule(self) -> Any:
        return self.trainer.datamodule

    def compile_networks(self) -> None:
        """Apply ``compile`` in place: parameter names, and so checkpoints, stay those of the eager networks."""
        if self.compile_mode:
            mode = None if self.compile_mode is True else self.compile_mode
            for network in self.compiled_networks():
                network.compile(mode=mode)

    def setup(self, stage: str) -> None:
        self.compile_networks()
        if stage == "fit":
            self.datamodule.connect(self.policy(), self.postprocess)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # The fused kernel updates every parameter in one op: on a small MLP it is 2-3x faster than the default.
        return torch.optim.Adam(self.loss_module.parameters(), lr=self.lr, fused=True)

    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:
        """One update. The batch is fetched here, not by Lightning, so that nothing is collected ahead of the
        weights: Lightning's default loop prefetches the next batch, which would step the environments with a
        policy one update stale and put that extra collection inside the checkpoint a resumed run starts from.
        """
        batch, _, _ = next(dataloader_iter)
        losses = self.loss(batch)
        loss = sum(value for key, value in losses.items() if key.startswith("loss"))
        if self.global_step % self.check_finite_every == 0 and not torch.isfinite(loss):
            raise FloatingPointError(
                f"the training loss is {loss.item()} at update {self.global_step} "
                f"({self.datamodule.frames} frames): training stopped before the optimizer step, "
                "so the last checkpoint holds the last good weights"
            )
        # Lightning writes metrics every `log_every_n_steps` steps, but each self.log call costs about 0.2 ms on
        # CPU whether written or not: on a loop of thousands of small updates a second, log only what is written.
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0:
            metrics = {f"train/{key}": value.detach() for key, value in losses.items() if value.numel() == 1}
            metrics.pop("train/loss", None)
            metrics.update(self.extra_metrics())
            self.log("train/loss", loss.detach(), prog_bar=True, batch_size=batch.numel())
            self.log_dict(metrics, batch_size=batch.numel())
        return loss

    def extra_metrics(self) -> dict[str, torch.Tensor | float]:
        """Agent-specific training metrics beyond the loss terms (ε, ...). Default: none."""
        return {}

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        self.on_update()
        self.datamodule.after_update()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """``python -m app validate``: greedy episodes in the evaluation environments."""
        metrics = self.datamodule.evaluate(self.greedy_policy())
        self.log_dict({f"eval/{key}": value for key, value in metrics.items()}, batch_size=1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The specs are rebuilt from the config on load; pickled spec objects would not load with weights_only.
        checkpoint.get("hyper_parameters", {}).pop("observation_spec", None)
        checkpoint.get("hyper_parameters", {}).pop("action_spec", None)
