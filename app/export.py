"""``python -m app export``: trace a trained policy from a checkpoint alone, check it against eager, benchmark it.

Commands::

    lightrl export --ckpt_path runs/pirl_vehicle/version_0/checkpoints/last.ckpt --threads 1
    lightrl export --ckpt_path last.ckpt --config configs/snake_dqn.yaml --batch-sizes 256 --out export

The model and data module are rebuilt from the run's config (``config.yaml`` beside the checkpoint, or ``--config``)
as ``fit`` builds them (:func:`app.cli.build`), the checkpoint's weights loaded, and
:func:`export.tracing.export_policy` run on ``export_network()``, checked on random inputs and on the environment's
own states (:mod:`export.inputs`). Flags it does not know (``--data.init_args.env.init_args.size 12``) override the
config. The work is the export library's (export/); this is its command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from app.errors import OneLineArgumentParser
from app.trained import load_trained, run_folder_of
from export.inputs import environment_check_inputs
from export.loader import METADATA
from export.report import BENCHMARK
from export.tracing import BACKENDS, check_options, export_network_of, export_policy, output_kind


def main(argv: Sequence[str] | None = None, prog: str = "lightrl export") -> dict[str, Any]:
    """Parses ``argv`` (default ``sys.argv[1:]``), exports, and returns the metadata written to ``export.json``.
    Bad input exits with status 2 and one line ``<prog>: error: ...`` naming the flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineArgumentParser(
        prog=prog,
        description="Trace a trained policy from a checkpoint, check it against eager and benchmark it.",
        allow_abbrev=False,  # the unknown flags go to the model's config: never guess which of ours they abbreviate
    )
    # --ckpt_path as in fit, validate and watch; --checkpoint, its former name, still works.
    parser.add_argument(
        "--ckpt_path", "--checkpoint", required=True, help="a Lightning checkpoint (e.g. .../checkpoints/last.ckpt)"
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="the training config(s), composed in order; default the run's saved config.yaml near the checkpoint",
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[512, 1024, 2048], help="traced batch sizes")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="default auto: Neuron, else the fastest")
    parser.add_argument("--out", default=None, help="output folder; default <run folder>/export")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for the checks and benchmark")
    parser.add_argument("--check-batches", type=int, default=3, help="batches of each input set compared with eager")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="max |traced - eager| allowed")
    parser.add_argument("--benchmark-seconds", type=float, default=1.0, help="time per benchmark figure")
    parser.add_argument("--no-benchmark", action="store_true", help="skip the benchmark")
    args, overrides = parser.parse_known_args(argv)

    checkpoint = Path(args.ckpt_path)
    if not checkpoint.is_file():
        parser.error(f"--ckpt_path {checkpoint}: no such file")
    try:
        sizes = check_options(
            args.batch_sizes,
            args.backend,
            args.check_batches,
            args.tolerance,
            args.benchmark_seconds,
            flag=lambda name: "--" + name.replace("_", "-"),
        )
    except ValueError as error:
        parser.error(str(error))
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    model, datamodule, _ = load_trained(parser, "--ckpt_path", checkpoint, args.config, overrides)
    torch.set_num_threads(args.threads)  # after build, which sets the config's own `threads`
    try:
        network, shape, dtype = export_network_of(model)
    except NotImplementedError as error:  # an agent with no plain network to trace (recurrent PPO's LSTM state)
        parser.error(f"--ckpt_path {checkpoint}: {error}; its policy cannot be exported")
    out = Path(args.out) if args.out else run_folder_of(checkpoint) / "export"
    print(
        f"Exporting {type(model).__name__}.export_network() from {checkpoint} (torch threads: {args.threads}) to {out}"
    )
    metadata = export_policy(
        network,
        shape,
        dtype,
        sizes,
        out,
        args.backend,
        args.check_batches,
        args.tolerance,
        not args.no_benchmark,
        args.benchmark_seconds,
        command=[prog, *argv],
        progress=print,
        input_sets=environment_check_inputs(datamodule),  # the data module is built on the CPU: so are its envs
        checkpoint=checkpoint,
        outputs=output_kind(model),
    )
    report = f"; benchmark: {out / (BENCHMARK + '.md')}" if not args.no_benchmark else ""
    print(f"Wrote {out / METADATA}{report}")
    return metadata
