"""SIGTERM on a run of several ranks (DDP on one machine or on several): every rank stops after the same update."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from compat.lightning import record_sigterm_only, stop_on_sigterm


class StopTogether(Callback):
    """Every rank stops on SIGTERM at the end of the same update, wherever and whenever the signal arrived.

    A cluster's scheduler signals every node of a job it ends, each at its own moment, and may signal one node alone.
    Each rank only records the signal; after each update the ranks agree on it (an all-reduce of one flag), and all of
    them stop at that update's end, where the checkpoint callback saves every rank's state. Left to Lightning, a rank
    stops on its own signal while the others go on into the next update's collectives and wait for it forever. With
    one rank this does nothing.
    """

    def __init__(self) -> None:
        self._signalled = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._signalled = False
        if trainer.world_size > 1:
            record_sigterm_only(trainer, self._record)

    def _record(self) -> None:
        self._signalled = True

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if trainer.world_size > 1:
            flag = torch.tensor([int(self._signalled)], device=trainer.strategy.root_device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                stop_on_sigterm(trainer)
