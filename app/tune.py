"""``python -m app tune``: a hyperparameter search with Optuna, each trial an ordinary ``fit``, pruned on evaluations.

Commands::

    python -m app tune --config configs/snake_ppo.yaml --space configs/tune/snake_ppo_space.yaml --trials 20 \\
        --timeout-per-trial 120
    python -m app tune ... --parallel 2 --pruner hyperband --out runs/snake_ppo_tune   # unknown flags go to fit
    python -m app fit --config configs/snake_ppo.yaml --config runs/snake_ppo_tune/best.yaml   # the best trial's config

The space is a YAML file keyed by the options' full dotted paths (``model.init_args.optimizer.lr: {type: float, low:
1.0e-5, high: 1.0e-3, log: true}``; ``type`` is ``float``, ``int`` or ``categorical``). Every key is checked against
the real parser before any trial runs: the configs are built with the space's lowest values, then its highest.

Each trial is ``python -m app fit --config ... --<key> <value> ...`` in its own process, its run folder
``<out>/trial_<n>/version_0`` (the config's logger pointed there) and its output in ``<out>/trial_<n>.log``. The
trial's evaluations (the config's ``PeriodicEvaluation``, every N frames) are the trial's intermediate values, at the
step of the frame count they are scheduled for: :class:`callbacks.tuning.EvaluationFeed` writes each to the run's
folder as it is made, this process reports it to Optuna, and a trial the pruner stops gets SIGTERM (it checkpoints
and exits between two updates). The objective, maximised, is the trial's last evaluation: the return of the weights
the run ends with, which is what its config delivers (the best evaluation along the way would favour lucky draws).

The study lives in ``<out>/study.db`` (SQLite; ``optuna-dashboard sqlite:///<out>/study.db`` shows it), one study per
folder. A stopped search (Ctrl-C, or the process killed) continues when the same command is run again: finished
trials are kept, a trial cut short by the stop is marked failed and its values are queued to run again from the
start, and ``--trials N`` counts the finished trials (completed, pruned, or failed on their own) of the whole study.
After every trial, ``<out>/best.yaml`` (the best trial's values as a config composed after the others) and
``<out>/trials.md`` (every trial: state, values, objective, frames, wall time) are rewritten.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app import launch
from app.errors import OneLineArgumentParser, check_config_files
from app.seeds import _composed
from compat.extras import install_command

STORAGE = "study.db"
PRUNERS = ("median", "hyperband", "none")
OBJECTIVE = "eval/return_mean"
_POLL_S = 0.5  # how often a running trial's evaluations are read


@dataclass(frozen=True)
class Dimension:
    """One entry of the search space: an option's dotted path and the distribution its values are drawn from."""

    key: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """Draw this dimension's value for an Optuna trial; lists among the choices travel as JSON text."""
        if self.type == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.key, self.low, self.high, log=self.log, step=self.step or 1)
        return self.decode(trial.suggest_categorical(self.key, [_encode(choice) for choice in self.choices]))

    def decode(self, value: Any) -> Any:
        """A parameter as Optuna stores it, back to the option's value."""
        if self.type == "categorical" and isinstance(value, str) and value not in self.choices:
            return json.loads(value)
        return value

    def corners(self) -> tuple[Any, Any]:
        """The lowest and the highest value (the first and the last choice), which the parser checks."""
        if self.type == "categorical":
            return self.choices[0], self.choices[-1]
        return self.low, self.high


def _encode(choice: Any) -> Any:
    return json.dumps(choice) if isinstance(choice, list | dict) else choice


def _number(value: Any) -> Any:
    # PyYAML reads 1e-5 (no dot) as text; a bound written that way is meant as the number.
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    return value


def read_space(path: str) -> list[Dimension]:
    """The space file's dimensions, checked for form; raises ValueError with one line naming the entry."""
    try:
        entries = yaml.safe_load(Path(path).read_text())
    except OSError:
        raise ValueError("no such file") from None
    except yaml.YAMLError as error:
        raise ValueError(f"not YAML: {' '.join(str(error).split())}") from None
    if not isinstance(entries, dict) or not entries:
        raise ValueError(
            "expected a mapping of option paths to distributions, e.g. model.init_args.optimizer.lr: "
            "{type: float, low: 1.0e-5, high: 1.0e-3, log: true}"
        )
    return [_dimension(str(key), spec) for key, spec in entries.items()]


def _dimension(key: str, spec: Any) -> Dimension:
    if key.startswith("-") or not all(key.split(".")):
        raise ValueError(f"{key}: a key is an option's dotted path without dashes, e.g. model.init_args.optimizer.lr")
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"{key}: expected a mapping with a type (float, int or categorical), got {spec!r}")
    kind = spec["type"]
    allowed = {
        "float": {"low", "high", "log", "step"},
        "int": {"low", "high", "log", "step"},
        "categorical": {"choices"},
    }
    if kind not in allowed:
        raise ValueError(f"{key}: unknown type {kind!r}; choose float, int or categorical")
    unknown = set(spec) - allowed[kind] - {"type"}
    if unknown:
        raise ValueError(f"{key}: {kind} takes {', '.join(sorted(allowed[kind]))}, not {', '.join(sorted(unknown))}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"{key}: categorical needs a non-empty list of choices, got {choices!r}")
        return Dimension(key, kind, choices=tuple(choices))
    low, high, step, log = (
        _number(spec.get("low")),
        _number(spec.get("high")),
        _number(spec.get("step")),
        spec.get("log", False),
    )
    number = int if kind == "int" else (int, float)
    for name, value in (("low", low), ("high", high)):
        if not isinstance(value, number) or isinstance(value, bool):
            raise ValueError(
                f"{key}: {kind} needs a numeric {name}{' (an integer)' if kind == 'int' else ''}, got {value!r}"
            )
    if low >= high:
        raise ValueError(f"{key}: low must be < high, got low {low} and high {high}")
    if not isinstance(log, bool):
        raise ValueError(f"{key}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ValueError(f"{key}: a log scale needs low > 0, got {low}")
    if step is not None and (not isinstance(step, number) or step <= 0 or log):
        raise ValueError(f"{key}: step must be a number > 0 (and not with log), got {step!r}")
    return Dimension(key, kind, low=low, high=high, log=log, step=step)


def flag_value(value: Any) -> str:
    """A value as the command line takes it (jsonargparse reads JSON/YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def overrides_for(values: dict[str, Any]) -> list[str]:
    return [arg for key, value in values.items() for arg in (f"--{key}", flag_value(value))]


class SpaceError(ValueError):
    """An entry of the search space that the configs' parser refuses."""


def check_space(configs: Sequence[str], dimensions: Sequence[Dimension], overrides: Sequence[str]) -> None:
    """Build the configs with every dimension at its lowest, then at its highest value, as ``fit`` would parse and
    construct them. Raises :class:`SpaceError` with one line naming the space's entry that was refused, or ValueError
    with the parser's line when the configs (or the flags for ``fit``) are refused without the space."""
    for corner in (0, 1):
        values = {dimension.key: dimension.corners()[corner] for dimension in dimensions}
        message = _build_error(configs, [*overrides, *overrides_for(values)])
        if message is None:
            continue
        named = [key for key in values if message.startswith(f"--{key} ") or message.startswith(f"--{key}:")]
        if named:
            raise SpaceError(message.removeprefix("--"))
        if _build_error(configs, overrides) is not None:
            raise ValueError(message)  # the configs (or the flags for fit) are refused without the space
        for key, value in values.items():  # the parser named an enclosing option: find the entry it refused
            if _build_error(configs, [*overrides, *overrides_for({key: value})]) is not None:
                if "unrecognized arguments" in message:
                    raise SpaceError(f"{key} is not an option ({message})")
                raise SpaceError(f"{key}: {message}")
        raise SpaceError(message)


def _build_error(configs: Sequence[str], flags: Sequence[str]) -> str | None:
    """The one line ``fit`` would print for these configs and flags before training (None: they build)."""
    from app.cli import build  # the training stack, once the tune command's own flags are known to be good

    stderr = io.StringIO()
    quiet = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.WARNING)  # the seed and device lines of a build that only checks
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build(list(configs), list(flags))
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.startswith("error: ")]
        return lines[-1].removeprefix("error: ") if lines else " ".join(stderr.getvalue().split())
    except ValueError as error:  # the trainer's own refusals (app/cli.py names their flags)
        return " ".join(str(error).split())
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return None


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted option paths to the nested mapping a config file holds."""
    tree: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


class Search:
    """The trials of one study: asks Optuna for values, runs each trial's ``fit``, reports, prunes, tells."""

    def __init__(
        self, args: argparse.Namespace, dimensions: list[Dimension], overrides: list[str], out: Path, study: Any
    ) -> None:
        import optuna

        self.optuna, self.args, self.dimensions, self.overrides, self.out = optuna, args, dimensions, overrides, out
        self.study = study
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.running = 0  # trials this process is running

    # -- the study's bookkeeping ------------------------------------------------------------------------------------
    def finished(self) -> int:
        states = self.optuna.trial.TrialState
        return sum(
            trial.state in (states.COMPLETE, states.PRUNED)
            or (trial.state == states.FAIL and trial.user_attrs.get("outcome") == "error")
            for trial in self.study.get_trials(deepcopy=False)
        )

    def requeue_stale(self) -> list[int]:
        """Trials left running by a search that was killed: marked failed, their values queued to run again."""
        from checkpoints.files import process_alive

        stale = []
        for trial in self.study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,)):
            pid = trial.user_attrs.get("pid")
            if pid is not None and pid != os.getpid() and process_alive(pid):
                continue  # another tune command on this study is running it
            self.study.tell(trial.number, state=self.optuna.trial.TrialState.FAIL, skip_if_finished=True)
            self.study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})
            stale.append(trial.number)
        return stale

    def next_trial(self) -> Any | None:
        with self.lock:
            if self.stopping.is_set() or self.finished() + self.running >= self.args.trials:
                return None
            trial = self.study.ask()
            trial.set_user_attr("pid", os.getpid())
            self.running += 1
            return trial

    # -- one trial ----------------------------------------------------------------------------------------------------
    def command(self, number: int, values: dict[str, Any]) -> list[str]:
        """Trial ``number``'s ``fit``: its arguments after ``python -m app``."""
        configs = [arg for path in self.args.config for arg in ("--config", path)]
        command = ["fit", *configs, "--threads", str(self.args.threads)]
        command += ["--trainer.logger.init_args.save_dir", str(self.out)]
        command += ["--trainer.logger.init_args.name", f"trial_{number}", "--trainer.logger.init_args.version", "0"]
        command += ["--trainer.callbacks+=callbacks.tuning.EvaluationFeed", *self.overrides]
        if self.args.timeout_per_trial is not None:
            seconds = int(self.args.timeout_per_trial)
            command += ["--trainer.max_time", f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"]
        return command + overrides_for(values)

    def run_trial(self, trial: Any) -> None:
        from callbacks.tuning import FEED

        values = {dimension.key: dimension.suggest(trial) for dimension in self.dimensions}
        run = self.out / f"trial_{trial.number}"
        shutil.rmtree(run, ignore_errors=True)  # a number is never reused within a study: nothing of it to keep
        log = self.out / f"trial_{trial.number}.log"
        trial.set_user_attr("run", str(run.relative_to(self.out) / "version_0"))
        print(f"trial {trial.number}: {_describe(values)}", flush=True)
        start = time.perf_counter()
        feed, reported, records, pruned = run / "version_0" / FEED, set(), [], False
        with open(log, "w") as output:
            process = launch.start(self.command(trial.number, values), stdout=output.fileno(), stderr=output.fileno())
            while True:
                exited = process.poll() is not None
                for record in _read_feed(feed)[len(records) :]:
                    records.append(record)
                    if record["step"] not in reported and not pruned:
                        reported.add(record["step"])
                        trial.report(record["return_mean"], record["step"])
                        if not exited and trial.should_prune():
                            pruned = True
                            process.send_signal(signal.SIGTERM)  # it checkpoints and exits between two updates
                if exited:
                    break
                time.sleep(_POLL_S)
        trial.set_user_attr("wall_s", time.perf_counter() - start)
        if records:
            trial.set_user_attr("frames", records[-1]["frames"])
        states = self.optuna.trial.TrialState
        code = process.returncode
        if pruned:
            self.study.tell(trial, state=states.PRUNED)
            print(f"trial {trial.number}: pruned at {records[-1]['frames']:,} frames", flush=True)
        elif code == 0 and records:
            self.study.tell(trial, records[-1]["return_mean"])
            print(f"trial {trial.number}: {OBJECTIVE} {records[-1]['return_mean']:.4g}", flush=True)
        elif self.stopping.is_set() or code < 0 or code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            trial.set_user_attr("outcome", "interrupted")  # not the trial's doing: it runs again next time
            self.study.tell(trial, state=states.FAIL)
            self.study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})
        else:
            tail = log.read_text().strip().splitlines()[-1:] or ["no evaluation"]
            trial.set_user_attr("outcome", "error")
            trial.set_user_attr("error", tail[0])
            self.study.tell(trial, state=states.FAIL)
            print(f"trial {trial.number}: failed with exit code {code}: {tail[0]} (whole output: {log})", flush=True)
        with self.lock:
            self.running -= 1
            write_reports(self.study, self.dimensions, self.out, self.args.config, self.overrides)

    def worker(self) -> None:
        while (trial := self.next_trial()) is not None:
            self.run_trial(trial)

    def run(self) -> None:
        with ThreadPoolExecutor(self.args.parallel) as pool:
            futures = [pool.submit(self.worker) for _ in range(self.args.parallel)]
            try:
                for future in futures:
                    future.result()
            except KeyboardInterrupt:
                self.stopping.set()  # the trials' processes got the same Ctrl-C; their threads mark them interrupted
                for future in futures:
                    future.result()
                raise


def _describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{key.rpartition('.')[2]}={_short(value)}" for key, value in values.items())


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _read_feed(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line]  # the last piece: a line being written


def write_reports(
    study: Any, dimensions: Sequence[Dimension], out: Path, configs: Sequence[str], overrides: Sequence[str]
) -> None:
    """``<out>/trials.md`` (every trial) and ``<out>/best.yaml`` (the best completed trial's values)."""
    from optuna.trial import TrialState

    by_key = {dimension.key: dimension for dimension in dimensions}
    trials = study.get_trials(deepcopy=False)
    names = [dimension.key.rpartition(".")[2] for dimension in dimensions]
    rows = []
    for trial in trials:
        state = trial.state.name.lower() + (" (stopped)" if trial.user_attrs.get("outcome") == "interrupted" else "")
        values = [_short(by_key[key].decode(trial.params[key])) if key in trial.params else "" for key in by_key]
        objective = f"{trial.value:.4g}" if trial.value is not None else ""
        frames, wall = trial.user_attrs.get("frames"), trial.user_attrs.get("wall_s")
        rows.append(
            f"| {trial.number} | {state} | {' | '.join(values)} | {objective} | "
            f"{'' if frames is None else f'{frames:,}'} | {'' if wall is None else f'{wall:,.0f}'} |"
        )
    completed = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    best = max(completed, key=lambda trial: trial.value) if completed else None
    lines = [
        f"# Study {study.study_name}: {len(trials)} trials",
        "",
        f"Objective ({OBJECTIVE} of the trial's last evaluation, maximised): "
        + (f"best trial {best.number}, {best.value:.4g} (`best.yaml`)." if best else "no completed trial yet."),
        "",
        f"| trial | state | {' | '.join(names)} | objective | frames | wall s |",
        f"|---:|---|{'---:|' * len(names)}---:|---:|---:|",
        *rows,
        "",
    ]
    (out / "trials.md").write_text("\n".join(lines))
    if best is None:
        return
    values = {key: by_key[key].decode(value) if key in by_key else value for key, value in best.params.items()}
    run = " ".join(f"--config {path}" for path in configs)
    header = [
        f"# The best trial of study {study.study_name} (python -m app tune): trial {best.number}, {OBJECTIVE} "
        f"{best.value:.4g} at {best.user_attrs.get('frames', 0):,} frames.",
        f"# Run it: python -m app fit {run} --config {out / 'best.yaml'}",
    ]
    if overrides:
        header.append(f"# The trials also ran with: {' '.join(overrides)}")
    (out / "best.yaml").write_text("\n".join(header) + "\n" + yaml.safe_dump(nested(values), sort_keys=False))


def _pruner(optuna: Any, args: argparse.Namespace, every_n_frames: int) -> Any:
    if args.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=args.startup_trials, n_warmup_steps=args.warmup_frames)
    if args.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(every_n_frames, args.warmup_frames, 1))
    return optuna.pruners.NopPruner()


def _evaluation_interval(configs: Sequence[str]) -> int | None:
    """``every_n_frames`` of the configs' PeriodicEvaluation (or subclass), None when they have none."""
    from app.run_folder import import_class
    from callbacks.schedule import PeriodicEvaluation

    callbacks = (_composed(configs).get("trainer") or {}).get("callbacks") or []
    for entry in callbacks if isinstance(callbacks, list) else [callbacks]:
        if not isinstance(entry, dict) or "class_path" not in entry:
            continue
        try:
            cls = import_class(entry["class_path"])
        except (ImportError, AttributeError, ValueError):
            continue
        if isinstance(cls, type) and issubclass(cls, PeriodicEvaluation):
            return (entry.get("init_args") or {}).get("every_n_frames", 50_000)
    return None


def main(argv: Sequence[str] | None = None, prog: str = "lightrl tune") -> None:
    """Parses ``argv`` (flags it does not know go to every trial's ``fit``), checks the space, runs the search.
    Bad input exits with status 2 and one line ``<prog>: error: ...`` naming the flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineArgumentParser(
        prog=prog, description="Search a config's hyperparameters with Optuna.", allow_abbrev=False
    )
    parser.add_argument("--config", action="append", required=True, help="the training config(s), composed in order")
    parser.add_argument("--space", required=True, help="the search space: a YAML of option paths to distributions")
    parser.add_argument("--trials", type=int, required=True, help="finished trials the study should hold in total")
    parser.add_argument("--study", default=None, help="the study's name (default the config's run name)")
    parser.add_argument("--out", default=None, help="folder of the study and its trials (default runs/<name>_tune)")
    parser.add_argument("--timeout-per-trial", type=float, default=None, help="each trial's training time, seconds")
    parser.add_argument("--pruner", choices=PRUNERS, default="median", help="how trials are stopped early")
    parser.add_argument("--startup-trials", type=int, default=5, help="median: trials finished before any is pruned")
    parser.add_argument("--warmup-frames", type=int, default=0, help="no pruning before this many frames")
    parser.add_argument("--sampler-seed", type=int, default=None, help="seed of Optuna's TPE sampler")
    parser.add_argument("--parallel", type=int, default=1, help="trials run at once (each with --threads threads)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each trial's process")
    args, overrides = parser.parse_known_args(argv)
    for flag, value in (("--trials", args.trials), ("--parallel", args.parallel), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--startup-trials", args.startup_trials), ("--warmup-frames", args.warmup_frames)):
        if value < 0:
            parser.error(f"{flag} must be >= 0, got {value}")
    if args.timeout_per_trial is not None and not (
        math.isfinite(args.timeout_per_trial) and args.timeout_per_trial >= 1
    ):
        parser.error(f"--timeout-per-trial must be >= 1 second, got {args.timeout_per_trial:g}")
    check_config_files(parser, args.config)
    try:
        dimensions = read_space(args.space)
    except ValueError as error:
        parser.error(f"--space {args.space}: {error}")
    try:
        import optuna
    except ImportError:
        parser.error(f"the optuna package is not installed; {install_command('tune')} (or pip install optuna)")
    logger = (_composed(args.config).get("trainer") or {}).get("logger")
    if not isinstance(logger, dict) or "class_path" not in logger:
        parser.error(
            f"--config {args.config[-1]}: the trials' runs need the config's trainer.logger (e.g. a CSVLogger)"
        )
    every_n_frames = _evaluation_interval(args.config)
    if every_n_frames is None:
        parser.error(
            f"--config {args.config[-1]}: the trials are judged by their evaluations; add a "
            "callbacks.schedule.PeriodicEvaluation to trainer.callbacks"
        )
    try:
        check_space(args.config, dimensions, overrides)
    except SpaceError as error:
        parser.error(f"--space {args.space}: {error}")
    except ValueError as error:
        parser.error(str(error))

    name = (logger.get("init_args") or {}).get("name") or Path(args.config[0]).stem
    study_name = args.study or name
    out = Path(args.out or f"runs/{name}_tune").resolve()
    out.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the search prints its own line per trial
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{out / STORAGE}",
        engine_kwargs={"connect_args": {"timeout": 60}},  # parallel trials wait, not fail
    )
    others = [other for other in optuna.get_all_study_names(storage) if other != study_name]
    if others:
        parser.error(f"--study {study_name}: {out / STORAGE} holds study {others[0]}; one study per --out folder")
    study = optuna.create_study(storage=storage, study_name=study_name, direction="maximize", load_if_exists=True)
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        parser.error(f"--study {study_name}: the stored study minimises; {OBJECTIVE} is maximised")
    # A resumed search draws on from where it was, rather than repeating the first trials' draws.
    seed = None if args.sampler_seed is None else args.sampler_seed + len(study.trials)
    study = optuna.load_study(
        study_name=study_name,
        storage=storage,
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=_pruner(optuna, args, every_n_frames),
    )
    search = Search(args, dimensions, overrides, out, study)
    for number in search.requeue_stale():
        print(f"trial {number}: left running by a stopped search; it runs again", flush=True)
    done = search.finished()
    if done:
        print(
            f"study {study_name}: {done} finished trials in {out / STORAGE}; running {max(args.trials - done, 0)} more",
            flush=True,
        )
    try:
        search.run()
    except KeyboardInterrupt:
        write_reports(study, dimensions, out, args.config, overrides)
        sys.exit(f"{prog}: stopped; {search.finished()} trials finished. Run the same command to continue.")
    write_reports(study, dimensions, out, args.config, overrides)
    states = optuna.trial.TrialState
    if not study.get_trials(deepcopy=False, states=(states.COMPLETE,)):
        sys.exit(f"{prog}: error: no trial completed; see {out / 'trials.md'} and the trials' logs")
    print(
        f"Wrote {out / 'trials.md'} and {out / 'best.yaml'} (best trial {study.best_trial.number}, {OBJECTIVE} "
        f"{study.best_value:.4g})",
        flush=True,
    )
