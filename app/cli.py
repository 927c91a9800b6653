"""The lightrl command line: Lightning's CLI with the agents, data modules and RL defaults registered.

Commands::

    python -m app fit --config configs/snake_dqn.yaml                      # train
    python -m app fit --config configs/snake_ppo.yaml --config configs/bench/throughput.yaml   # benchmark
    python -m app fit --config configs/snake_dqn.yaml --trainer.max_steps 2000 --model.init_args.optimizer.lr 3e-4
    python -m app fit --config configs/snake_dqn.yaml --ckpt_path last     # continue its newest run, in its folder
    python -m app validate --config configs/snake_dqn.yaml --ckpt_path runs/snake_dqn/.../last.ckpt
    python -m app fit --config configs/snake_dqn.yaml --print_config       # the fully resolved config
    lightrl export --ckpt_path runs/snake_dqn/.../last.ckpt          # trace the policy (app/export.py)
    python -m app watch --ckpt_path runs/snake_dqn/version_0 --episodes 3  # its greedy episodes as MP4 (app/watch.py)
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import yaml
from jsonargparse import Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden
from torchrl.envs import EnvBase

from app.errors import (
    COMPONENT_KEYS,
    OneLineErrorParser,
    checkpoint_mismatch_line,
    configured_owners,
    constructor_error_line,
    exit_now,
    tag_constructor_errors,
    typed,
)
from app.run_folder import ResumableCSVLogger, SaveRunConfig, import_class, resolve_resume
from app.stages import run_stage, stage_configs, stage_folder
from app.tracking import arrange_loggers, check_packages, continue_runs, expand_short_names
from callbacks.progress import RLProgressBar
from callbacks.schedule import FrameCheckpoint
from callbacks.sigterm import StopTogether
from callbacks.tracking import TrackingRuns
from checkpoints.files import CheckpointMismatch, CheckpointWriteError, beside_base, rank_state_path
from checkpoints.resume import checkpoint_global_step, missing_beside
from compat.jsonargparse import read_init_of_subclasses
from compat.lightning import cli_config_get
from datamodules.base import RLDataModule, resolve_device
from datamodules.memory import check_memory, parameters_need
from modules.base import RLModule
from modules.optim import OPTION as OPTIMIZER_OPTION

# TorchRL announces every storage it allocates at INFO level; keep the console for what the user asked for.
logging.getLogger("torchrl").setLevel(logging.WARNING)
# Infinite data streams have no length; Lightning's reminders about it carry no information here.
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
warnings.filterwarnings("ignore", message=".*Total length of `DataLoader` across ranks is zero.*")
# The update is one unit (loss, backward, step) inside a training step, so a checkpoint taken after the step holds the
# state after the update, which is what a resume needs; Lightning's caution is for models that step mid-way.
warnings.filterwarnings("ignore", message=".*Using ModelCheckpoint with manual optimization and every_n_train_steps.*")
# Lightning's own pytree helper on this torch version; nothing of the project's.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
# tensordict reads a torch.compile setting that torch 2.13 deprecated (always on now): harmless, raised on every run.
warnings.filterwarnings("ignore", message=".*inline_inbuilt_nn_modules is deprecated.*")


#: The largest seed ``seed_everything`` accepts (NumPy's seeds are 32-bit).
MAX_SEED = 2**32 - 1


class _WithoutAdvertisements(logging.Filter):
    """Drops Lightning's product tips from its info lines (the run's own lines stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip:")


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_WithoutAdvertisements())


class _HeldSeedNote(logging.Filter):
    """Holds Lightning's "Seed set to N" line, logged while the command line is read, until every option has been
    checked (:meth:`RLCLI.instantiate_classes` releases it): bad input is then the one ``error:`` line alone."""

    logger = logging.getLogger("lightning.fabric.utilities.seed")

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []
        self.logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Seed set to"):
            self.held.append(record)
            return False
        return True

    def release(self) -> None:
        self.logger.removeFilter(self)
        for record in self.held:
            self.logger.handle(record)
        self.held.clear()


# TorchRL's EnvBase defines __new__ as a classmethod; jsonargparse compares bound methods by identity, concludes that
# every env subclass overrides __new__, and reads its (*args, **kwargs) instead of the env's __init__. Env options
# (`--data.init_args.env.init_args.size`) are then neither documented nor checked.
read_init_of_subclasses(EnvBase)


class RLCLI(LightningCLI):
    """LightningCLI for the agents (:class:`RLModule` on an :class:`RLDataModule`) and for the supervised stages
    that feed them (behaviour cloning on demonstrations: any LightningModule and LightningDataModule whose data
    module has the environment's specs)."""

    def __init__(self, *args, parser_class=OneLineErrorParser, **kwargs) -> None:
        self.argv = list(sys.argv[1:] if kwargs.get("args") is None else kwargs["args"])
        self._seed_note = _HeldSeedNote()
        try:
            super().__init__(*args, parser_class=parser_class, **kwargs)
        except SystemExit:
            self._seed_note.held.clear()  # an option refused: its error line is all there is to say
            raise
        finally:
            self._seed_note.release()  # nothing left once released (instantiate_classes); the filter goes

    def subcommands(self) -> dict[str, set[str]]:
        # Lightning's test and predict need a test_step/predict_step over a dataset; an RL run's evaluation is
        # `validate` (greedy episodes), so only the subcommands that work are offered.
        offered = {name: skip for name, skip in LightningCLI.subcommands().items() if name in ("fit", "validate")}
        # A subcommand's parser holds every option of the Trainer, the model and the data module, so a command line
        # that names its subcommand builds that one's parser alone (the overview, `--help` without one, and a
        # misspelt one still list them all).
        named = self.argv[0] if self.argv else None
        return {named: offered[named]} if named in offered else offered

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        main_kwargs.setdefault(
            "epilog",
            "Every command (seeds, tune, watch, export, ...) with one line each: lightrl --help.",
        )
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)

    def parse_arguments(self, parser, args) -> None:
        # `--trainer.logger wandb` (a backend's short name, app/tracking.py) becomes the class path jsonargparse parses.
        if isinstance(args, dict | Namespace):
            super().parse_arguments(parser, args)
            self._note_parsed_config()
            return
        try:
            argv = expand_short_names(sys.argv[1:] if args is None else args)
        except ValueError as error:
            parser.error(str(error))
        self.config = parser.parse_args(argv)
        self._note_parsed_config()

    def _note_parsed_config(self) -> None:
        """What the parsed config tells before anything is built: the configured model and data classes, which the
        parser's error lines spell flags for (:func:`~app.errors.spell_flags`), and the seed the run's stages follow
        (app/stages.py): the ``seed_everything`` the run was given, read before Lightning replaces ``true`` by a seed
        it draws (a stage at a new seed each time would never be reused)."""
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        # Library code names options by their config keys (model.gamma); the error lines spell them as flags.
        self.parser.option_owners = configured_owners(config)
        seed = config.get("seed_everything")
        self.stage_seed = seed if type(seed) is int else None  # not True or False, which are ints too
        if self.stage_seed is not None and not 0 <= seed <= MAX_SEED:  # Lightning's own refusal is a traceback
            self.parser.error(f"--seed_everything must be in [0, {MAX_SEED}] (NumPy's seeds), got {seed}")

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--threads",
            type=int,
            default=1,
            help="torch intra-op threads per process. 1 is fastest for small batched envs on a shared CPU; "
            "raise it on an idle many-core machine.",
        )
        parser.add_argument(
            "--flush_denormal",
            type=bool,
            default=True,
            help="treat float32 values below 1.2e-38 (subnormals) as zero on the CPU, as XLA and TensorFlow do: "
            "arithmetic on them runs many times slower on x86, and Adam's running averages of a weight that stopped "
            "learning decay through them (docs/guide/hardware.md); false keeps IEEE subnormals.",
        )
        parser.add_argument(
            "--memory_check",
            type=bool,
            default=True,
            help="estimate at start what the run's stores (replay buffer, frame ring, rollout, model and optimizer) "
            "will take and refuse a config that cannot fit in the memory available (datamodules/memory.py); false "
            "skips it.",
        )
        # The model is sized by the environment: specs flow one way, from the data module's throw-away env.
        parser.link_arguments(
            "data.observation_spec",
            "model.init_args.observation_spec",
            apply_on="instantiate",
        )
        parser.link_arguments("data.action_spec", "model.init_args.action_spec", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        threads = config.get("threads", 1)
        if threads < 1:
            self.parser.error(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
        # Per thread, and inherited by the threads started after it (torch's intra-op pool, a prefetch thread).
        torch.set_flush_denormal(bool(config.get("flush_denormal", True)))
        nodes = config["trainer"].get("num_nodes") or 1
        if nodes > 1 and not any(name in os.environ for name in RENDEZVOUS_VARIABLES):
            self.parser.error(
                f"--trainer.num_nodes {nodes}: no rendezvous to meet the other nodes at; start this command on every "
                "node with torchrun (--nnodes, --node_rank, --master_addr, --master_port) or srun under SLURM "
                "(docs/guide/multi-gpu.md)"
            )
        self._move_gradient_clipping(config)
        self._resolve_stage_paths(config)
        self._seed_environments(config)
        tracking = self._arrange_loggers(config)
        self._resume_checkpoint(config)
        if tracking:
            self._continue_backend_runs(config)
        for option, stage in self._stages(config).items():
            try:
                # readable, with a logger that names its folder
                stage_folder(stage, _model_flag(option), self.stage_seed)
            except ValueError as error:
                self.parser.error(str(error))
        callbacks = list(self.trainer_defaults.get("callbacks", []))
        if tracking:  # after the config's callbacks: its on_fit_end sees the throughput report written
            callbacks.append(TrackingRuns())
        if config["trainer"].get("enable_progress_bar") is False:  # the flag also turns off the default bar
            callbacks = [c for c in callbacks if not isinstance(c, RLProgressBar)]
        elif not _is_subclass(config["data"], RLDataModule):  # epochs of a dataset: Lightning's own bar
            callbacks = [TQDMProgressBar() if isinstance(c, RLProgressBar) else c for c in callbacks]
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": callbacks}

    def _move_gradient_clipping(self, config) -> None:
        # The agents run their own update (loss, backward, clip, step as one unit), and Lightning clips and
        # accumulates only in automatic optimization: its flags are honoured by handing the values to the model.
        if not _is_subclass(config["model"], RLModule):  # Lightning's automatic optimization clips by itself
            return
        trainer, optimizer = config["trainer"], config["model"]["init_args"]["optimizer"]
        accumulate = trainer.get("accumulate_grad_batches", 1)
        if accumulate != 1:
            if optimizer.accumulate_grad_batches not in (1, accumulate):
                self.parser.error(
                    f"--trainer.accumulate_grad_batches {accumulate} and {OPTIMIZER_OPTION}.accumulate_grad_batches "
                    f"{optimizer.accumulate_grad_batches} disagree; set one of them"
                )
            optimizer.accumulate_grad_batches, trainer["accumulate_grad_batches"] = accumulate, 1
        clip = trainer.get("gradient_clip_val")
        if clip is None:
            return
        if trainer.get("gradient_clip_algorithm") not in (None, "norm"):
            self.parser.error("--trainer.gradient_clip_algorithm: only norm clipping is supported (the default)")
        if optimizer.max_grad_norm not in (None, clip):
            self.parser.error(
                f"--trainer.gradient_clip_val {clip} and {OPTIMIZER_OPTION}.max_grad_norm {optimizer.max_grad_norm} "
                "disagree; set one of them"
            )
        optimizer.max_grad_norm, trainer["gradient_clip_val"] = clip, None

    def _arrange_loggers(self, config) -> bool:
        # A tracking backend keeps the run's local folder (a CSV logger before it) and the project's defaults; done
        # before `--ckpt_path` is resolved against that folder (app/tracking.py). Returns whether there is a backend.
        try:
            check_packages(config["trainer"])
        except ValueError as error:
            self.parser.error(str(error))
        return arrange_loggers(config["trainer"], config.get("config") or [])

    def _continue_backend_runs(self, config) -> None:
        step = None
        if self.resume_from is not None and self.subcommand == "fit":
            try:
                step = checkpoint_global_step(self.resume_from)
            except ValueError as error:
                self.parser.error(str(error))
        continue_runs(config["trainer"], self.resume_from if step is not None else None, step)

    def _resume_checkpoint(self, config) -> None:
        # `--ckpt_path` is resolved before the trainer exists: the logger must know the version of the run it
        # continues before it creates a folder (app/run_folder.py).
        self.resume_from = None
        if self.subcommand in ("fit", "validate"):
            try:
                self.resume_from = resolve_resume(config, self.subcommand)
            except ValueError as error:
                self.parser.error(str(error))

    def _seed_environments(self, config) -> None:
        # One seed for the whole run: a data module whose seed is not set takes seed_everything's (Lightning has
        # drawn one by now if it was `true`; `false` seeds nothing, and the environments then use 0).
        init_args = config["data"].get("init_args")
        seed = config.get("seed_everything")
        if init_args is not None and "seed" in init_args and init_args["seed"] is None and type(seed) is int:
            init_args["seed"] = seed

    def _resolve_stage_paths(self, config) -> None:
        """A relative path in an option that names a file to read (a stage's config or checkpoint: the model's
        ``stage_options``) is read against the config file that set it, so a config runs from any folder; one typed
        on the command line, against the current folder. (Output folders, such as a logger's ``save_dir``, stay
        relative to the current folder: a run writes where it is started.)"""
        model = config["model"]
        class_path, init_args = getattr(model, "class_path", None), model.get("init_args")
        if class_path is None or init_args is None:
            return
        for option in getattr(import_class(class_path), "stage_options", ()):
            value = init_args.get(option)
            if not isinstance(value, str) or Path(value).is_absolute() or typed(_model_flag(option), self.argv):
                continue
            source = _config_that_set(config.get("config") or [], ("model", "init_args", option), value)
            if source is not None:
                init_args[option] = str(source.parent / value)

    def _stages(self, config) -> dict[str, Path]:
        """The earlier stages a fresh ``fit`` runs first (``{model option: stage config}``, app/stages.py). A resumed
        run (any ``--ckpt_path``) has its weights already, and ``validate`` trains nothing: no stage for them."""
        if self.subcommand != "fit" or config.get("ckpt_path") is not None:
            return {}
        return stage_configs(config["model"])

    def _run_stages(self, config) -> None:
        # After every option has been checked (the constructors, the trainer) and before anything is written. Rank 0
        # runs a stage; the other ranks reuse it, waiting for it when they were started beside rank 0 rather than by it.
        # The stage runs at this run's seed when it was given one (app/stages.py).
        for option, stage in self._stages(config).items():
            flag = _model_flag(option)
            try:
                checkpoint = run_stage(stage, flag, self.stage_seed, wait=not self.trainer.is_global_zero)
            except ValueError as error:
                self.parser.error(str(error))
            setattr(self.model, option, str(checkpoint))  # the model reads that checkpoint when fit starts

    def before_fit(self) -> None:
        self._run_stages(self.config.get(self.subcommand))
        if self.resume_from is None:
            return
        try:
            step = checkpoint_global_step(self.resume_from)
        except ValueError as error:
            self.parser.error(str(error))
        for name in missing_beside(self.resume_from):
            self.parser.error(
                f"--ckpt_path {self.resume_from}: its replay buffer's folder {name} is not beside it (keep the folder "
                "with its checkpoint)"
            )
        if self.trainer.num_nodes == 1:  # on several nodes, other ranks' files are on other machines' disks
            saved = torch.load(self.resume_from, map_location="cpu", mmap=True, weights_only=True)
            data = next((state for state in saved.values() if isinstance(state, dict) and "updates" in state), {})
            for rank in range(1, self.trainer.world_size):
                path = rank_state_path(beside_base(self.resume_from, data), rank, step)
                if not path.is_file():
                    self.parser.error(
                        f"--ckpt_path {self.resume_from}: no state of rank {rank} beside it ({path.name}); "
                        f"it was written by fewer ranks than this run has"
                    )
        for logger in self.trainer.loggers:
            if isinstance(logger, ResumableCSVLogger):
                logger.continue_after(step)  # drop the rows logged after the checkpoint, append after the rest

    def instantiate_classes(self) -> None:
        # Impossible values are caught by the constructors; report them like parse errors (one line naming the flag,
        # exit 2) instead of a traceback, before the trainer has created any output folder. Environments and
        # callbacks are built inside other objects: their errors are tagged with their class on the way out.
        for component in COMPONENT_KEYS:
            self.parser.add_instantiator(tag_constructor_errors, component, subclasses=True)
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        try:
            super().instantiate_classes()
        except (ValueError, MisconfigurationException) as error:
            self.parser.error(constructor_error_line(error, config, self.parser.args))
        self._seed_note.release()

    def instantiate_trainer(self, **kwargs):
        # Options that are each fine alone but do not fit together (a recurrent model on a data module that cuts no
        # sequences): the model checks the data module it was given, reported the same way, before the trainer
        # exists (it prints its devices and makes the run's folder).
        if isinstance(self.model, RLModule) and isinstance(self.datamodule, RLDataModule):
            try:
                self.model.check_datamodule(self.datamodule)
            except ValueError as error:
                self.parser.error(str(error))
        # Callbacks that need something of the environment (a video needs one that renders), likewise; and a
        # callback with checkpointed state given twice (Lightning would refuse it only once fit starts, in lines).
        trainer = cli_config_get(self, self.config_init, "trainer")
        callbacks = trainer.get("callbacks") or []
        stateful: dict[str, int] = {}
        for index, callback in enumerate(callbacks if isinstance(callbacks, list) else [callbacks]):
            if isinstance(callback, Callback) and is_overridden("state_dict", callback, Callback):
                first = stateful.setdefault(callback.state_key, index)
                if first != index:
                    name = f"{type(callback).__module__}.{type(callback).__qualname__}"
                    self.parser.error(
                        f"trainer.callbacks[{index}] ({name}) is trainer.callbacks[{first}] again, and both would save "
                        "their state under one name in checkpoints: give it once (the config may already have it)"
                    )
            check = getattr(callback, "check_datamodule", None)
            if callable(check):
                try:
                    check(self.datamodule)
                except ValueError as error:
                    name = f"{type(callback).__module__}.{type(callback).__qualname__}"
                    self.parser.error(f"trainer.callbacks[{index}] ({name}): {error}")
        listed = callbacks if isinstance(callbacks, list) else [callbacks]
        if (
            self.subcommand == "fit"
            and trainer.get("enable_checkpointing", True)
            and not any(isinstance(callback, ModelCheckpoint) for callback in listed)
        ):
            # Lightning's own default checkpoint (epoch=…-step=….ckpt at the end) is not what --ckpt_path last
            # resumes: a config without a checkpoint callback gets FrameCheckpoint's defaults (last.ckpt).
            kwargs["callbacks"] = [*listed, FrameCheckpoint()]
        try:
            built = super().instantiate_trainer(**kwargs)
        except (ValueError, MisconfigurationException) as error:
            trainer = cli_config_get(self, self.config_init, "trainer")
            named = re.match(r"`(\w+)` must", str(error))  # Lightning names the argument it refuses: `max_steps` must
            if any(word in str(error).lower() for word in ("gpu", "cuda", "device", "accelerator", "backend")):
                flags = f"--trainer.accelerator {trainer.accelerator} --trainer.devices {trainer.devices}"
            elif named is not None and named.group(1) in trainer:
                flags = f"--trainer.{named.group(1)}"
            else:
                flags = "--trainer"
            raise ValueError(f"{flags}: {error}") from error
        self._check_memory(built)
        self._check_run_folders(built)
        return built

    def _check_run_folders(self, trainer: pl.Trainer) -> None:
        """Refuse, before anything is written, a logger folder that cannot be written (a read-only file system, a
        file where a folder should be): one line naming the folder, not the logger's traceback mid-setup."""
        for logger in trainer.loggers:
            folder = getattr(logger, "save_dir", None)
            if not isinstance(folder, str | os.PathLike) or "://" in str(folder):
                continue  # a tracking server's address, not a folder
            try:
                os.makedirs(folder, exist_ok=True)
                writable = os.access(folder, os.W_OK)
            except OSError as error:
                self.parser.error(f"--trainer.logger.init_args.save_dir {folder}: cannot create it ({error.strerror})")
            if not writable:
                self.parser.error(f"--trainer.logger.init_args.save_dir {folder}: cannot write in it (read-only)")

    def _check_memory(self, trainer: pl.Trainer) -> None:
        """Refuse, before the stores are allocated (the data module's ``setup``), a run whose stores cannot fit in the
        memory available; warn when they nearly fill it (datamodules/memory.py)."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if self.subcommand != "fit" or not config.get("memory_check", True):
            return
        if not isinstance(self.datamodule, RLDataModule):
            return
        device = resolve_device(self.datamodule.device_name, trainer)
        needs = [*self.datamodule.memory_needs(device)]
        if isinstance(self.model, torch.nn.Module):
            needs.append(parameters_need(self.model, trainer.strategy.root_device))
        try:
            warnings_found = check_memory(needs)
        except ValueError as error:
            self.parser.error(str(error))
        for line in warnings_found:
            if trainer.is_global_zero:
                print(f"warning: {line}", file=sys.stderr)


def _model_flag(option: str) -> str:
    return f"--model.init_args.{option}"


def _config_that_set(configs: Sequence[Any], keys: tuple[str, ...], value: str) -> Path | None:
    """The last of the ``--config`` files (in the order given) that sets ``keys`` to ``value``; None: none did."""
    found = None
    for config in configs:
        path = Path(os.fspath(config))
        try:
            node = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node == value:
            found = path.resolve()
    return found


def _is_subclass(component: Any, base: type) -> bool:
    """Whether a ``class_path`` component of the parsed config names a subclass of ``base``."""
    class_path = getattr(component, "class_path", None)
    return class_path is not None and issubclass(import_class(class_path), base)


#: Variables a cluster launcher sets on each node of a multi-node run (torchrun, SLURM, LSF, MPI, Kubeflow's RANK;
#: NODE_RANK with MASTER_ADDR and MASTER_PORT set by hand for Lightning's own): without one, node 0 would wait for the
#: others forever.
RENDEZVOUS_VARIABLES = ("GROUP_RANK", "RANK", "SLURM_NTASKS", "LSB_JOBID", "OMPI_COMM_WORLD_RANK", "NODE_RANK")


def trainer_defaults() -> dict:
    return {
        "max_epochs": -1,  # an RL stream has no epochs: max_steps (updates) ends training
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,  # `fit` evaluates with the PeriodicEvaluation callback; `validate` overrides this
        "plugins": [{"class_path": "checkpoints.io.AtomicCheckpointIO"}],
        "enable_checkpointing": True,
        # frames, rates and the latest evaluation on the bar; with several ranks, SIGTERM stops them all at one update
        "callbacks": [RLProgressBar(), StopTogether()],
    }


def main(args: list[str] | None = None, extra_callbacks: Sequence[Callback] = (), prog: str = "python -m app") -> RLCLI:
    """``python -m app``: the CLI on ``args`` (default: the command line). ``extra_callbacks`` join the config's
    (benchmarks add their instruments this way); ``prog`` is the command its help and usage lines name."""
    argv = sys.argv[1:] if args is None else args
    defaults = trainer_defaults()
    defaults["callbacks"] = [*defaults["callbacks"], *extra_callbacks]
    if argv and argv[0] == "validate":
        defaults["limit_val_batches"] = 1
    try:
        return RLCLI(
            pl.LightningModule,
            pl.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults=defaults,
            save_config_callback=SaveRunConfig,
            save_config_kwargs={"overwrite": True},
            args=args,
            auto_configure_optimizers=False,
            parser_kwargs={"prog": prog},
        )
    except SIGTERMException:
        # Lightning stops after the current update (FrameCheckpoint saves then) and exits with status 0, which a
        # scheduler would read as a finished run.
        print("stopped by SIGTERM: continue with --ckpt_path last", file=sys.stderr)
        raise SystemExit(128 + signal.SIGTERM) from None
    except CheckpointMismatch as error:
        # Raised while the checkpoint loads, before anything ran: one line. Refused in worker processes, the workers
        # died of it, and the process ends as after any worker's death (exit_now).
        line = checkpoint_mismatch_line(error)
        if error.in_workers:
            exit_now(line)
        print(f"error: {line}", file=sys.stderr)
        raise SystemExit(1) from None
    except CheckpointWriteError as error:
        # A full disk or a failed write: the previous checkpoints are whole and the temporaries are gone, so one line
        # says all there is (exit status 1, as for any error).
        print(f"error: checkpoint not saved: {error.strerror}", file=sys.stderr)
        raise SystemExit(1) from None


def build(config_paths: list[str], overrides: list[str] | tuple[str, ...] = ()) -> tuple[RLModule, RLDataModule]:
    """The model and data module a config describes, built as ``main`` builds them but without running anything.

    For tools that need a trained run's networks outside ``fit`` (``python -m app export``): load a
    checkpoint's ``state_dict`` into the returned model.

    Args:
        config_paths: config files, composed in order like repeated ``--config`` flags (e.g. a run's ``config.yaml``).
        overrides: further flags, e.g. ``["--data.init_args.num_envs", "4"]``.
    """

    class _BuildCLI(RLCLI):
        def add_arguments_to_parser(self, parser) -> None:
            super().add_arguments_to_parser(parser)
            # A run's saved config also holds its subcommand's arguments (`ckpt_path`, ...), which a parser without
            # subcommands would reject; accept them (`validate` takes all of `fit`'s), though nothing runs to use them.
            parser.add_method_arguments(self.trainer_class, "validate", skip=self.subcommands()["validate"])

    args = [arg for path in config_paths for arg in ("--config", str(path))]
    with warnings.catch_warnings():
        # The calling tool's own sys.argv is not meant for this parser; Lightning warns when both are present.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = _BuildCLI(
            pl.LightningModule,
            pl.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults=trainer_defaults(),
            save_config_callback=None,  # nothing runs, so nothing to record
            args=[*args, *overrides],
            auto_configure_optimizers=False,
            run=False,
        )
    return cli.model, cli.datamodule
