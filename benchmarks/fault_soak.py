"""Fault-injection soak: a shipped config killed, stopped and starved of disk at random moments, resumed each time,
ends with the state of the same run left alone.

    python benchmarks/fault_soak.py --collection in_process --faults 30 --seed 0
    python benchmarks/fault_soak.py --collection prefetch --faults 20 --seed 1
    python benchmarks/fault_soak.py --collection collector_workers --faults 20 --seed 2
    python benchmarks/fault_soak.py --collection frame_once --faults 10 --seed 3

``--collection`` picks the shipped config and how it collects (:data:`COLLECTIONS`); the run is shortened by flags
only (``--max-steps`` updates, small buffers, a checkpoint every ``--checkpoint-frames`` frames so that faults land
between checkpoints and while one is written).

1. The **reference**: the command run once, uninterrupted, in ``<out>/reference``; its wall time T is measured.
2. **Laps** on a tmpfs of their own (so that the disk can really be filled; an ordinary folder, and no disk-full
   faults, where none can be mounted): the same command is started, and after a delay drawn uniformly in [0, T) by
   ``random.Random(seed)`` one fault is delivered to it; then the same command again with ``--ckpt_path last`` (or
   without it when no checkpoint exists yet), with the next fault, until one process reaches ``--max-steps``. Then
   the lap's final state is compared with the reference, and the next lap starts, until ``--faults`` were delivered.
   The faults come in a random order drawn from the seed, each kind once per round:

   - ``sigkill``: SIGKILL to the training process (``kill -9``, the out-of-memory killer).
   - ``sigkill_worker``: SIGKILL to one of its worker processes (collections with workers only).
   - ``sigterm``: SIGTERM to the training process (``kill``, a scheduler's preemption): it saves and exits 143.
   - ``disk_full``: a file fills the tmpfs to leave less than a checkpoint needs (a fraction of the newest
     checkpoint's bytes, drawn from the seed): the next checkpoint fails with one error line, exit 1. The file is
     removed before the resume.

   A delay longer than the process lives delivers nothing (the process ended first): counted, not a fault.
3. **Checks**, per lap: the final checkpoint's weights, optimizer state, data-module state and replay buffer's
   written rows equal the reference's, tensor by tensor (where the collection resumes exactly: ``exact`` in
   :data:`COLLECTIONS`), and metrics.csv has the reference's rows (wall-clock columns aside); no temporary file
   (``.<name>.tmp-<pid>``) anywhere in the lap's folder; per process, its exit status is the one its fault should give
   and no process of its group outlives it by more than :data:`STRAY_SECONDS`.

Writes ``<out>/soak.json`` and ``<out>/soak.md`` (the figures in docs/results/infrastructure.md, "Fault-injection
soak"), and each process's stderr under ``<out>/logs``. Exit status 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from checkpoints.files import TEMPORARY_MARK, kept_path, updates_in_name  # noqa: E402
from datamodules.workers import worker_pids  # noqa: E402
from tests.app.test_resume import SHORT, metrics_rows  # noqa: E402
from tests.helpers import assert_same, fill, saved_replay, small_file_system  # noqa: E402

# Snake's boards stepped by the torch backend: the same games as the default C++ kernel without its first-use build;
# the loss eager: compiling it costs seconds at every start of a process, which the soak starts dozens of times
# (tests/agents check that the compiled loss gives the eager one's numbers).
SNAKE = [*SHORT["snake_dqn"], "--data.init_args.env.init_args.backend", "torch", "--model.init_args.compile", "false"]
# Mario on the real emulator, small enough for a CPU (tests/app/test_mario.py's sizes): small frames, short stacks, a
# small buffer, batches of 16 without accumulation.
MARIO = [
    "--data.init_args.env.init_args.size", "40", "--data.init_args.env.init_args.frame_stack", "4",
    "--data.init_args.env.init_args.stuck_steps", "15", "--data.init_args.num_envs", "2",
    "--data.init_args.collect_steps", "4", "--data.init_args.buffer_size", "2000", "--data.init_args.batch_size", "16",
    "--data.init_args.warmup_frames", "64", "--model.init_args.optimizer.accumulate_grad_batches", "1",
]  # fmt: skip


@dataclass(frozen=True)
class Collection:
    config: str  # under configs/
    flags: tuple[str, ...]
    exact: bool  # the project documents (and tests) an exact resume for it: compare the state tensor by tensor
    workers: bool  # it has worker processes to kill


COLLECTIONS = {
    "in_process": Collection("snake_dqn.yaml", (*SNAKE,), exact=True, workers=False),
    "prefetch": Collection("snake_dqn.yaml", (*SNAKE, "--data.init_args.collection.prefetch", "true"), True, False),
    "collector_workers": Collection(
        "snake_dqn.yaml",
        (*SNAKE, "--data.init_args.collection", "CollectorWorkers", "--data.init_args.collection.workers", "2"),
        exact=True,
        workers=True,
    ),
    # The frame-once store (the shipped config's store_frames_once) collected in step with the learner: exact.
    "frame_once": Collection(
        "mario_ddqn.yaml", (*MARIO, "--data.init_args.collection", "InProcess"), exact=True, workers=False
    ),
    # As shipped: asynchronous workers, whose episodes restart on a resume (docs/systems/mario.md, "Asynchronous
    # collector workers"): resumes, not exactly.
    "async_workers": Collection("mario_ddqn.yaml", (*MARIO,), exact=False, workers=True),
}
KINDS = ("sigkill", "sigkill_worker", "sigterm", "disk_full")
STRAY_SECONDS = 15.0  # docs/guide/resuming.md: worker processes stop "within seconds" of the training process
SIGTERM_STATUS = 128 + signal.SIGTERM  # docs/guide/resuming.md, "Stopping a run"


@dataclass
class Process:
    """One start of the command and what happened to it."""

    lap: int
    resumed_from: int | None  # the update of the checkpoint it resumed from; None: started fresh
    fault: str | None = None  # the fault drawn for it
    delay_s: float = 0.0
    draw: float = 0.0  # a second draw for it: which worker to kill, the fraction of a checkpoint left free
    delivered: bool = False
    first_checkpoint_s: float | None = None  # when its first checkpoint appeared (the reference's: its start-up)
    status: int | None = None
    seconds: float = 0.0
    reached: int = 0  # the last update it logged (metrics.csv) before it ended
    expected: bool = True  # its exit status and error lines are those its fault should give
    error_line: str = ""
    strays: list[str] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collection", choices=COLLECTIONS, default="in_process")
    parser.add_argument("--config", help="a shipped config other than the collection's (configs/<name>.yaml)")
    parser.add_argument("--faults", type=int, default=12, help="faults to deliver, over as many laps as that takes")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, help="default: every kind the collection allows")
    parser.add_argument("--seed", type=int, default=0, help="draws the faults' kinds, moments and disk space left")
    parser.add_argument("--max-steps", type=int, default=300, help="updates of the run")
    parser.add_argument("--checkpoint-frames", type=int, default=256, help="FrameCheckpoint's every_n_frames")
    parser.add_argument("--out", type=Path, default=Path("runs/fault_soak"))
    args = parser.parse_args()
    report = soak(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=2))
    (args.out / "soak.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if report["passed"] else 1


def soak(args: argparse.Namespace) -> dict:
    collection = COLLECTIONS[args.collection]
    config = ROOT / "configs" / (args.config or collection.config)
    out = args.out.resolve()
    shutil.rmtree(out / "reference", ignore_errors=True)
    shutil.rmtree(out / "logs", ignore_errors=True)
    (out / "logs").mkdir(parents=True)
    command = [sys.executable, "-m", "app", "fit", "--config", str(config), "--config", str(overlay(config, args, out))]
    command += [*collection.flags, "--threads", "1", "--trainer.max_time", "null", "--trainer.max_steps"]
    command += [str(args.max_steps), "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "5"]
    # metrics.csv written every 5 updates too: the soak reads progress from it, and kills land in its writes.
    command += ["--trainer.logger.init_args.flush_logs_every_n_steps", "5"]
    started = time.monotonic()

    reference_dir = out / "reference"
    reference_dir.mkdir()
    reference = run(command, reference_dir, None, None, out / "logs/reference.err", Process(lap=0, resumed_from=None))
    if reference.status != 0:
        raise SystemExit(
            f"error: the reference run exited with status {reference.status}: {out / 'logs/reference.err'}"
        )
    reference_run = run_folder(reference_dir)
    reference_bytes = sum(path.stat().st_size for path in reference_run.rglob("*") if path.is_file())

    rng = random.Random(args.seed)
    kinds = [kind for kind in (args.kinds or KINDS) if collection.workers or kind != "sigkill_worker"]
    disk = out / "disk"
    # Room for the finished run, a checkpoint more while one is written, and the logs: the filler takes the rest.
    with small_file_system(disk, max(32, 4 * reference_bytes >> 20)) as refused:
        if refused:
            kinds = [kind for kind in kinds if kind != "disk_full"]
        order: list[str] = []
        processes: list[Process] = []
        laps: list[dict] = []
        delivered = 0
        while delivered < args.faults:
            lap_dir = disk / f"lap{len(laps)}"
            shutil.rmtree(lap_dir, ignore_errors=True)
            lap_dir.mkdir()
            while True:
                resume_from = newest_checkpoint(lap_dir)
                process = Process(lap=len(laps), resumed_from=resume_from)
                if delivered < args.faults:
                    if not order:
                        order = rng.sample(kinds, len(kinds))  # each kind once per round, in a random order
                    process.fault = order[-1]
                    process.delay_s = rng.uniform(0, expected_seconds(reference, resume_from or 0, args.max_steps))
                    process.draw = rng.random()
                resume = [] if resume_from is None else ["--ckpt_path", "last"]
                log = out / f"logs/lap{process.lap}-{len(processes)}.err"
                run(command + resume, lap_dir, disk if refused is None else None, reference_run, log, process)
                processes.append(process)
                if process.delivered:
                    order.pop()
                    delivered += 1
                if process.status == 0 and not process.delivered:
                    break
                if process.status == 0 and finished(lap_dir, args.max_steps):
                    break  # a fault that came after the run's end (a SIGTERM while its reports were written)
                if not process.expected and not process.delivered:
                    break  # it failed by itself (a resume that does not start): compared as it stands, reported
            laps.append({"lap": process.lap, **compare(reference_run, lap_dir, collection.exact)})
            if all(laps[-1]["held"].values()):
                shutil.rmtree(lap_dir)  # the tmpfs holds one lap; a failed lap's folder is kept there for a look
            else:
                shutil.copytree(lap_dir, out / f"failed-lap{process.lap}", dirs_exist_ok=True)
                shutil.rmtree(lap_dir)
    return summary(args, collection, config, reference, processes, laps, refused, time.monotonic() - started)


def expected_seconds(reference: Process, start: int, max_steps: int) -> float:
    """How long a process that starts from update ``start`` should live, going by the reference: its start-up (up
    to its first checkpoint), then its share of the rest."""
    startup = reference.first_checkpoint_s or 0.0
    return startup + (reference.seconds - startup) * (1 - start / max_steps)


def overlay(config: Path, args: argparse.Namespace, out: Path) -> Path:
    """The shipped config's callbacks with a checkpoint every ``--checkpoint-frames`` frames, evaluations 4 times as
    rare, and no measuring of the bare update at the end (seconds of every process's life, not a fault surface)."""
    import yaml

    callbacks = yaml.safe_load(config.read_text())["trainer"]["callbacks"]
    for callback in callbacks:
        options = callback.setdefault("init_args", {})
        name = callback["class_path"].rpartition(".")[2]
        if name == "FrameCheckpoint":
            options["every_n_frames"] = args.checkpoint_frames
        elif name == "PeriodicEvaluation":
            options.update(every_n_frames=4 * args.checkpoint_frames, episodes=4)
        elif name == "ThroughputReport":
            options["bare_update_seconds"] = 0
    path = out / "callbacks.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return path


def run(
    command: list[str], cwd: Path, disk: Path | None, reference: Path | None, log: Path, process: Process
) -> Process:
    """Run ``command`` in ``cwd`` (its own process group) to its end, delivering ``process.fault`` after its delay."""
    started, wall_start = time.monotonic(), time.time()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as stderr:
        child = subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=stderr, env=env, start_new_session=True
        )
        filler = None
        if process.fault is None and reference is None:  # the reference: watch for its first checkpoint
            while child.poll() is None and process.first_checkpoint_s is None:
                if list(cwd.glob("runs/*/version_*/checkpoints/last-step*.ckpt")):
                    process.first_checkpoint_s = time.monotonic() - started
                time.sleep(0.01)
        if process.fault is not None:
            deadline = started + process.delay_s
            while time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.01)
            filler = deliver(child, process, cwd, disk, reference)
        # A run that never ends is a finding too: stopped after far longer than the reference took.
        try:
            child.wait(timeout=max(600.0, 20 * (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            process.error_line = "hung: killed by the soak"
        process.seconds = time.monotonic() - started
        process.status = child.returncode
    process.strays = strays(child.pid)
    if filler is not None:
        filler.unlink()
    errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    process.error_line = process.error_line or (errors[-1] if errors else "")
    process.expected = expected(process, errors, "Traceback" in log.read_text())
    # Its progress: the last update metrics.csv records, where this process wrote the file (rows of an earlier one
    # are not its work); a lower bound, the file being written every 5 updates.
    folder = run_folder(cwd, missing_ok=True)
    metrics = None if folder is None else folder / "metrics.csv"
    process.reached = process.resumed_from or 0
    if metrics is not None and metrics.is_file() and metrics.stat().st_mtime >= wall_start:
        process.reached = max(process.reached, reached(folder))
    return process


def deliver(child: subprocess.Popen, process: Process, cwd: Path, disk: Path | None, reference: Path | None):
    """Deliver ``process.fault`` to the running ``child`` (nothing if it has ended); returns the filler file of a
    disk-full fault."""
    if child.poll() is not None:
        return None
    if process.fault == "sigkill":
        child.send_signal(signal.SIGKILL)
    elif process.fault == "sigterm":
        child.send_signal(signal.SIGTERM)
    elif process.fault == "sigkill_worker":
        workers = []
        while not workers and child.poll() is None:  # started with the data module: wait for them if need be
            workers = worker_pids(child.pid)
            time.sleep(0.05)
        if not workers:
            return None
        os.kill(workers[int(process.draw * len(workers))], signal.SIGKILL)
    elif process.fault == "disk_full":
        # Less free space than a checkpoint needs: the newest one's files (this lap's, or the reference's before the
        # lap has any), a fraction drawn from the seed left free.
        folder = run_folder(cwd, missing_ok=True)
        newest = newest_checkpoint_bytes(folder / "checkpoints") if folder else 0
        newest = newest or newest_checkpoint_bytes(reference / "checkpoints")
        process.delivered = True
        return fill(disk, int((0.1 + 0.8 * process.draw) * newest))  # 10-90 % of it
    process.delivered = True
    return None


def expected(process: Process, errors: list[str], traceback: bool) -> bool:
    """Whether the process ended as its fault should make it end (docs/guide/resuming.md, "What survives which
    fault")."""
    status = process.status
    if process.error_line.startswith("hung") or process.strays:
        return False
    if not process.delivered:
        return status == 0
    if process.fault == "sigkill":
        return status == -signal.SIGKILL
    if process.fault == "sigterm":
        # Saved and stopped; killed outright while Python starts, before Lightning's handler is in place; or the run
        # had already finished its updates.
        return status in (SIGTERM_STATUS, -signal.SIGTERM, 0)
    if process.fault == "sigkill_worker":
        return status == 1 and len(errors) == 1 and not traceback or status == 0
    # disk_full: one line naming the folder and the bytes, no traceback; or the run's last write had happened.
    return status == 0 or status == 1 and len(errors) == 1 and "not saved" in errors[0] and not traceback


def group_members(group: int) -> list[str]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if int(fields[2]) == group and fields[0] != "Z":
                    command = (entry / "cmdline").read_bytes()[:80].replace(b"\0", b" ").decode()
                    members.append(f"{entry.name} {command}")
            except (OSError, IndexError):
                continue
    return members


def strays(group: int) -> list[str]:
    """Processes of the training process's group still running :data:`STRAY_SECONDS` after it ended (then killed)."""
    deadline = time.monotonic() + STRAY_SECONDS
    while (members := group_members(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if members:
        os.killpg(group, signal.SIGKILL)
    return members


def run_folder(cwd: Path, missing_ok: bool = False) -> Path | None:
    """The run's folder, ``runs/<name>/version_N``: the newest one holding a checkpoint, else the newest."""
    versions = sorted(cwd.glob("runs/*/version_*"), key=lambda path: int(path.name.rpartition("_")[2]))
    with_checkpoints = [path for path in versions if (path / "checkpoints/last.ckpt").is_file()]
    if not versions and missing_ok:
        return None
    return (with_checkpoints or versions)[-1]


def newest_checkpoint(cwd: Path) -> int | None:
    """The update of the newest checkpoint ``--ckpt_path last`` would find, or None where there is none yet."""
    folder = run_folder(cwd, missing_ok=True)
    if folder is None or not (folder / "checkpoints/last.ckpt").is_file():
        return None
    return max(updates_in_name(path) for path in (folder / "checkpoints").glob(kept_path("last.ckpt", "*").name))


def newest_checkpoint_bytes(folder: Path) -> int:
    step = max((updates_in_name(path) for path in folder.glob(kept_path("last.ckpt", "*").name)), default=None)
    if step is None:
        return 0
    files = [kept_path(folder / "last.ckpt", step), *folder.glob(f"last.ckpt.*-step{step}")]
    return sum(path.stat().st_size for file in files for path in (file, *file.rglob("*")) if path.is_file())


def reached(folder: Path) -> int:
    """The last update metrics.csv records (0 before it has any row)."""
    try:
        return max((int(row["step"]) for row in metrics_rows(folder) if row.get("step")), default=0)
    except (OSError, ValueError):
        return 0


def finished(cwd: Path, max_steps: int) -> bool:
    return newest_checkpoint(cwd) == max_steps


def compare(reference: Path, lap: Path, exact: bool) -> dict:
    """The lap's final state against the reference's: what held, and the first difference of what did not."""
    folder = run_folder(lap)
    held, differences = {}, {}

    def check(name: str, same) -> None:
        try:
            same()
            held[name] = True
        except (AssertionError, KeyError, OSError) as error:
            held[name], differences[name] = False, f"{type(error).__name__}: {error}"

    ours = torch.load(folder / "checkpoints/last.ckpt", weights_only=True)
    theirs = torch.load(reference / "checkpoints/last.ckpt", weights_only=True)
    data_key = next(key for key, value in theirs.items() if isinstance(value, dict) and "buffer_folder" in value)
    check("updates", lambda: assert_same(ours["global_step"], theirs["global_step"], "global_step"))
    if exact:
        check("weights", lambda: assert_same(ours["state_dict"], theirs["state_dict"], "state_dict"))
        check("optimizer", lambda: assert_same(ours["optimizer_states"], theirs["optimizer_states"], "optimizer"))
        check("data_state", lambda: assert_same(ours[data_key], theirs[data_key], data_key))
        check(
            "replay_buffer",
            lambda: assert_same(
                saved_replay(folder / "checkpoints/last.ckpt", ours[data_key]),
                saved_replay(reference / "checkpoints/last.ckpt", theirs[data_key]),
                "replay",
            ),
        )
        check("metrics", lambda: assert_same(comparable(metrics_rows(folder)), comparable(metrics_rows(reference))))
    else:  # the run trained to its end with every file intact and metrics.csv has each logging step once
        steps = [row["step"] for row in metrics_rows(folder) if row.get("train/loss")]
        check("metrics", lambda: assert_same(steps, sorted(set(steps), key=int), "metrics steps"))
    temporaries = [str(path.relative_to(lap)) for path in lap.rglob(f"*{TEMPORARY_MARK}*")]
    check("no_temporaries", lambda: assert_same(temporaries, [], "temporaries"))
    return {"held": held, "differences": differences, "run_folder": str(folder.relative_to(lap))}


def comparable(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """metrics.csv's rows without the wall-clock figures, which differ between any two runs."""
    return [
        {
            key: value
            for key, value in row.items()
            if not key.startswith(("time/", "throughput/")) and key != "eval/time_s"
        }
        for row in rows
    ]


def summary(args, collection, config, reference, processes, laps, refused, seconds) -> dict:
    faulted = [process for process in processes if process.delivered]
    by_kind = {kind: sum(process.fault == kind for process in faulted) for kind in KINDS}
    # Updates run again after a fault: all the processes' updates beyond the runs' own.
    done = sum(process.reached - (process.resumed_from or 0) for process in processes)
    redone = max(0, done - args.max_steps * len(laps))
    unexpected = [asdict(process) for process in processes if not process.expected]
    held = {name: all(lap["held"].get(name, True) for lap in laps) for lap in laps for name in lap["held"]}
    return {
        "collection": args.collection,
        "config": str(config.relative_to(ROOT)),
        "exact": collection.exact,
        "seed": args.seed,
        "max_steps": args.max_steps,
        "checkpoint_frames": args.checkpoint_frames,
        "command": "python benchmarks/fault_soak.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, torch {torch.__version__}",
        "disk_full_skipped": refused,
        "reference_seconds": round(reference.seconds, 1),
        "reference_first_checkpoint_s": round(reference.first_checkpoint_s or 0.0, 1),
        "faults": len(faulted),
        "faults_by_kind": by_kind,
        "not_delivered": sum(process.fault is not None and not process.delivered for process in processes),
        "resumes": sum(process.resumed_from is not None for process in processes),
        "fresh_restarts": sum(process.resumed_from is None for process in processes) - len(laps),
        "processes": len(processes),
        "laps": len(laps),
        "updates_redone": redone,
        "updates_total": args.max_steps * len(laps),
        "exit_statuses": sorted({f"{p.fault}:{p.status}" for p in processes if p.delivered}),
        "unexpected_endings": unexpected,
        "held": held,
        "laps_detail": laps,
        "processes_detail": [asdict(process) for process in processes],
        "seconds": round(seconds, 1),
        "passed": all(held.values()) and not unexpected,
    }


def markdown(report: dict) -> str:
    kinds = ", ".join(f"{kind} {count}" for kind, count in report["faults_by_kind"].items() if count)
    held = ", ".join(f"{name} {'yes' if ok else 'NO'}" for name, ok in report["held"].items())
    lines = [
        f"### {report['collection']} ({report['config']}, {report['max_steps']} updates, seed {report['seed']})",
        "",
        f"`{report['command']}` — {report['date']}, {report['machine']}",
        "",
        "| faults | by kind | resumes | fresh restarts | laps | updates redone | final state equal | wall time |",
        "|---|---|---|---|---|---|---|---|",
        f"| {report['faults']} | {kinds} | {report['resumes']} | {report['fresh_restarts']} | {report['laps']} "
        f"| {report['updates_redone']} of {report['updates_total']} | {'yes' if report['passed'] else 'NO'} "
        f"| {report['seconds']:.0f} s |",
        "",
        f"Checks, every lap: {held}. Exit statuses by fault: {', '.join(report['exit_statuses'])}. Faults not "
        f"delivered (the process ended first): {report['not_delivered']}. Unexpected endings: "
        f"{len(report['unexpected_endings'])}."
        + (f" Disk-full faults skipped: {report['disk_full_skipped']}." if report["disk_full_skipped"] else ""),
    ]
    for lap in report["laps_detail"]:
        for name, difference in lap["differences"].items():
            lines.append(f"- lap {lap['lap']}, {name}: {difference}")
    for ending in report["unexpected_endings"]:
        lines.append(
            f"- lap {ending['lap']}: {ending['fault']} after {ending['delay_s']:.1f} s ended with status "
            f"{ending['status']} {ending['error_line']!r} strays {ending['strays']}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
