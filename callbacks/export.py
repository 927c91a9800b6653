"""PolicyExport: after ``fit``, trace the trained policy network for fixed-batch inference, check it and benchmark it.

The tracing itself is :mod:`export.tracing`, the loader :mod:`export.loader`, the benchmark report
:mod:`export.report`, and the same export from a checkpoint alone is the command ``python -m app export``
(app/export.py).

Commands::

    python -m app fit --config configs/snake_dqn.yaml --trainer.callbacks+=callbacks.export.PolicyExport
    lightrl export --ckpt_path runs/snake_dqn/version_0/checkpoints/last.ckpt --threads 1
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from export.inputs import environment_check_inputs
from export.tracing import Backend, check_options, export_network_of, export_policy, output_kind


class PolicyExport(Callback):
    """After ``fit``, traces the policy network at fixed batch sizes, checks it against eager, and benchmarks it.

    Runs :func:`export.tracing.export_policy` on ``pl_module.export_network()`` (a CPU, fp32, eval-mode copy) on
    rank zero, in ``on_fit_end``, after the final checkpoint: if the export fails, ``lightrl export --ckpt_path``
    redoes it from that checkpoint. Traced and eager outputs are compared on random inputs and on the data module's
    own observations: its environment's start states and, when it exposes its dynamics, its collocation box
    (:mod:`export.inputs`). Load the result with :class:`export.loader.TracedPolicy`.

    Usage::

        python -m app fit --config configs/snake_dqn.yaml --trainer.callbacks+=callbacks.export.PolicyExport

    Args:
        batch_sizes: one traced module per batch size (Neuron and TorchScript shapes are fixed).
        dirpath: output folder; default ``<log_dir>/export`` (``default_root_dir`` without a logger).
        backend: ``auto`` (Neuron when ``torch_neuronx`` imports, else the faster of TorchScript and AOTInductor at
            each batch size: AOT compiles take seconds each), ``neuron``, ``torchscript`` or ``aot``.
        check_batches: batches of each input set, per batch size, on which traced and eager outputs are compared.
        tolerance: largest allowed max |traced - eager| (fp32); beyond it the export stops with an error.
        benchmark: time eager and traced inference at each batch size (``export_benchmark.json`` / ``.md``).
        benchmark_seconds: time per benchmark figure.
    """

    def __init__(
        self,
        batch_sizes: Sequence[int] = (512, 1024, 2048),
        dirpath: str | None = None,
        backend: Backend = "auto",
        check_batches: int = 3,
        tolerance: float = 1e-6,
        benchmark: bool = True,
        benchmark_seconds: float = 1.0,
    ) -> None:
        self.batch_sizes = check_options(
            batch_sizes,
            backend,
            check_batches,
            tolerance,
            benchmark_seconds,
            flag=lambda name: f"--trainer.callbacks.init_args.{name}",
        )
        self.dirpath, self.backend, self.check_batches, self.tolerance = dirpath, backend, check_batches, tolerance
        self.benchmark, self.benchmark_seconds = benchmark, benchmark_seconds
        self.metadata: dict[str, Any] | None = None  # the last export, for callers and tests

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            pl_module.export_network()  # an agent without one fails now, not after the whole training run

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Resolved on every rank: trainer.log_dir broadcasts, so rank zero alone would wait for the others forever.
        dirpath = Path(self.dirpath or Path(trainer.log_dir or trainer.default_root_dir) / "export")
        if not trainer.is_global_zero:
            return
        network, shape, dtype = export_network_of(pl_module)
        checkpoint = getattr(trainer.checkpoint_callback, "last_model_path", None) or None
        self.metadata = export_policy(
            network,
            shape,
            dtype,
            self.batch_sizes,
            dirpath,
            self.backend,
            self.check_batches,
            self.tolerance,
            self.benchmark,
            self.benchmark_seconds,
            progress=lambda line: print(f"Policy export: {line}"),
            input_sets=environment_check_inputs(getattr(trainer, "datamodule", None)),
            checkpoint=checkpoint,
            outputs=output_kind(pl_module),
        )
        eager = self.metadata["eager"]["file"]
        print(f"Policy export: {len(self.batch_sizes)} traced modules and {eager} in {dirpath}")


if __name__ == "__main__":  # `python -m callbacks.export`, the export tool's name before `python -m app export`
    import shlex
    import sys

    command = shlex.join(["python", "-m", "app", "export", *sys.argv[1:]])
    print(
        f"python -m callbacks.export: error: the export tool is now python -m app export (same flags): {command}",
        file=sys.stderr,
    )
    raise SystemExit(2)
