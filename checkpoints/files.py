"""Checkpoint files: the checkpoint itself (written by :class:`~checkpoints.io.AtomicCheckpointIO`) and what a data
module keeps beside it, their names, and writing them so that a kill never leaves half. Nothing here imports Lightning:
worker processes and environments import this module (for :class:`CheckpointMismatch`) without paying for it.

That state is per rank: with DDP each rank explores with its own seed, environments and store. Lightning writes only
rank 0's into the checkpoint, so every other rank writes its own file beside it (named by :func:`rank_state_path`).
Stores too large to pickle into a checkpoint (replay buffers) go beside it as memory-mapped folders
(:func:`beside_path`), written under a temporary name and renamed into place (:func:`write_folder_atomically`).
TensorDicts go into checkpoints as plain nested dicts (:func:`to_plain`), so they load with ``weights_only=True``.

Faults that must not lose a run:

- A full disk: every write here first checks the free space against the bytes it will write, and writes with plain
  ``write`` calls (never through a memory map, where a full disk is a SIGBUS that kills the process without a word).
  Either failure is a :class:`CheckpointWriteError`, one line naming the folder, the bytes needed and free; the
  temporary is removed and what was there before is untouched.
- Damaged files: each file written is hashed (SHA-256) as it is written; the digests go into a manifest beside it
  (``sha256sum -c`` reads it), and :func:`damage` checks them before a checkpoint is resumed.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import torch
from tensordict import TensorDict, TensorDictBase

TEMPORARY_MARK = ".tmp-"  # files and folders being written: .<name>.tmp-<pid of the writing process>
SUMS = ".sha256"  # a checkpoint's manifest: <checkpoint>.sha256, in sha256sum's format
# Free space kept on top of a write's own bytes: file-system metadata, and the serialiser's headers (torch.save's zip
# entries) that the count of tensor bytes does not see.
SPACE_MARGIN = 1 << 20


def rank_state_path(checkpoint_path: str | Path, rank: int, updates: int | None) -> Path:
    """The file beside a checkpoint that holds rank ``rank``'s data-module state, written at update ``updates``.

    The update is part of the name so that a run killed between writing the ranks' files and the checkpoint itself
    never pairs a checkpoint with newer files: the older ones are deleted only once the newer checkpoint is in place.
    """
    return Path(f"{checkpoint_path}.rank{rank}-step{updates}")


def beside_path(checkpoint_path: str | Path, kind: str, rank: int, updates: int) -> Path:
    """A folder beside a checkpoint holding rank ``rank``'s store ``kind`` (e.g. ``replay``) at update ``updates``:
    ``last.ckpt.replay-rank0-step1200``. Named like :func:`rank_state_path`, for the same reason."""
    return Path(f"{checkpoint_path}.{kind}-rank{rank}-step{updates}")


def beside_base(checkpoint_path: str | Path, state: dict) -> Path:
    """The path the files beside a checkpoint are named after: the checkpoint's own, or, for a kept checkpoint
    (``last-step1200.ckpt``), the name they were written under (``last.ckpt``), which its data state records."""
    checkpoint = Path(checkpoint_path)
    return checkpoint.parent / state.get("beside", checkpoint.name)


def sums_path(checkpoint_path: str | Path, rank: int, updates: int) -> Path:
    """The manifest of rank ``rank``'s files beside a checkpoint at update ``updates`` (its replay folder's files and,
    on ranks > 0, its state file): ``last.ckpt.sums-rank0-step1200``, in ``sha256sum``'s format."""
    return beside_path(checkpoint_path, "sums", rank, updates)


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the run loading it: written for another environment, network or agent. Its
    message is one line saying what differs; the command line prints it naming ``--ckpt_path``. ``in_workers``: the
    worker processes refused it (and died of it)."""

    def __init__(self, message: str, in_workers: bool = False) -> None:
        super().__init__(message)
        self.in_workers = in_workers


class CheckpointWriteError(OSError):
    """A checkpoint (or a file beside it) could not be written: a full disk, a file-size limit, an I/O error. Its
    message is one line naming the folder, the bytes needed and the bytes free."""


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def check_space(folder: Path, needed: int) -> None:
    """Raise :class:`CheckpointWriteError` unless ``folder``'s file system has ``needed`` bytes free (plus a margin)."""
    free = free_bytes(folder)
    if free < needed + SPACE_MARGIN:
        raise CheckpointWriteError(
            errno.ENOSPC, f"not enough disk space in {folder}: {needed:,} bytes needed, {free:,} free"
        )


def write_error(folder: Path, needed: int, error: OSError) -> CheckpointWriteError:
    """The one-line error for a write into ``folder`` that failed all the same (another process filled the disk
    meanwhile, a file-size limit, an I/O error)."""
    try:
        free = f"{free_bytes(folder):,}"
    except OSError:
        free = "unknown"
    reason = error.strerror or type(error).__name__
    return CheckpointWriteError(
        error.errno, f"cannot write in {folder} ({reason}): {needed:,} bytes needed, {free} free"
    )


def tensor_bytes(obj: Any) -> int:
    """The bytes of all tensors in a nested structure of dicts, lists and tensors: what ``torch.save`` writes of it,
    less its headers (:data:`SPACE_MARGIN`)."""
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes() if obj.numel() else 0
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(value) for value in obj)
    if isinstance(obj, TensorDictBase):
        return sum(tensor_bytes(value) for value in obj.values(include_nested=True, leaves_only=True))
    return 0


class HashingFile:
    """A write-only file that hashes what passes through it, so a file's checksum costs no second read."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file, self.hash = file, hashlib.sha256()
        self.error: OSError | None = None  # the first failed write: torch.save reports it as a RuntimeError

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.file.flush()

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


def reserve(file: IO[bytes], size: int) -> None:
    """Allocate ``size`` bytes of disk for ``file`` before it is written (``posix_fallocate``), so that a disk that
    cannot hold it fails here, at once, rather than part-way through; nothing where the platform or the file system
    has no such call (the writes are checked all the same)."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(file.fileno(), 0, size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


def save_hashed(obj: Any, file: IO[bytes]) -> str:
    """``torch.save(obj, file)`` with plain writes into the disk space reserved for it (:func:`reserve`: its tensors'
    bytes); return the SHA-256 of what was written.

    Raises:
        OSError: the space could not be reserved, or a write failed (torch's own writer turns that into a
            RuntimeError, which would not say why).
    """
    reserve(file, tensor_bytes(obj))
    hashing = HashingFile(file)
    try:
        torch.save(obj, hashing)
        file.flush()  # a write the buffer still holds fails here
    except RuntimeError:
        if hashing.error is not None:
            raise hashing.error from None
        file.flush()
        raise
    file.truncate(file.tell())  # what the reservation held beyond the file's end (the estimate is not exact)
    return hashing.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_atomically(obj: Any, path: Path, verify: bool = False) -> str:
    """``torch.save(obj)`` into ``path`` through a temporary beside it, renamed into place once flushed to disk; return
    the file's SHA-256. With ``verify``, the file is read back and its digest compared before the rename.

    Raises:
        CheckpointWriteError: not enough space for it, or the write failed (nothing at ``path`` changed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    needed = tensor_bytes(obj)
    check_space(path.parent, needed)
    temporary = path.with_name(f".{path.name}{TEMPORARY_MARK}{os.getpid()}")
    try:
        with open(temporary, "wb") as file:
            digest = save_hashed(obj, file)
            os.fsync(file.fileno())
        if verify and sha256_of(temporary) != digest:
            raise OSError(errno.EIO, "the file read back differs from what was written")
        os.replace(temporary, path)
    except OSError as error:
        raise write_error(path.parent, needed, error) from error
    finally:
        temporary.unlink(missing_ok=True)
    return digest


def write_sums(path: Path, digests: dict[str, str]) -> None:
    """Write ``digests`` (file name relative to ``path``'s folder → SHA-256) atomically, as ``sha256sum`` does."""
    temporary = path.with_name(f".{path.name}{TEMPORARY_MARK}{os.getpid()}")
    try:
        with open(temporary, "w") as file:
            file.writelines(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError as error:
        raise write_error(path.parent, 0, error) from error
    finally:
        temporary.unlink(missing_ok=True)


def read_sums(path: Path) -> dict[str, str]:
    sums = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        sums[name] = digest
    return sums


def damage(folder: Path, sums_files: Iterable[Path]) -> str | None:
    """Why the files the manifests ``sums_files`` list (names relative to ``folder``) are not as written, or None."""
    for sums in sums_files:
        try:
            listed = read_sums(sums)
        except OSError as error:
            return f"{sums.name} unreadable ({error.strerror})"
        for name, digest in listed.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if sha256_of(path) != digest:
                return f"{name} does not match its checksum in {sums.name}"
    return None


def updates_in_name(path: Path) -> int | None:
    """The update in a name ending ``-step<N>`` (``last-step1200.ckpt``, ``last.ckpt.rank1-step1200``), or None."""
    match = re.search(r"-step(\d+)(\.ckpt)?$", path.name)
    return int(match[1]) if match else None


def kept_path(last_path: str | Path, updates: int | str) -> Path:
    """The name a ``last`` checkpoint is kept under, written at update ``updates``: ``last-step1200.ckpt``."""
    last = Path(last_path)
    return last.with_name(f"{last.stem}-step{updates}{last.suffix}")


def link_atomically(source: Path, name: Path) -> None:
    """Make ``name`` another name of the file ``source`` (a hard link: no copy), replacing what ``name`` was in one
    rename. A file system without hard links gets a copy."""
    temporary = name.with_name(f".{name.name}{TEMPORARY_MARK}{os.getpid()}")
    temporary.unlink(missing_ok=True)
    try:
        try:
            os.link(source, temporary)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            shutil.copyfile(source, temporary)
        os.replace(temporary, name)
    except OSError as error:
        raise write_error(name.parent, source.stat().st_size, error) from error
    finally:
        temporary.unlink(missing_ok=True)


def checkpoint_damage(path: Path, beside: bool = True) -> str | None:
    """Why the checkpoint ``path`` cannot be resumed as written, or None: unreadable, not matching the SHA-256 in its
    manifest (``<name>.sha256``, or for ``last.ckpt`` its kept name's), or (with ``beside``: resuming training needs
    them, validating does not) a file beside it missing or changed."""
    try:
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        updates = int(saved["global_step"])
    except Exception as error:  # a truncated or foreign file: torch raises many kinds
        return f"not a readable checkpoint ({type(error).__name__})"
    for sums in (kept_path(path, updates).with_name(kept_path(path, updates).name + SUMS), Path(f"{path}{SUMS}")):
        if sums.is_file():
            listed = read_sums(sums)
            if len(listed) == 1 and sha256_of(path) != next(iter(listed.values())):
                return f"does not match its checksum in {sums.name}"
            break
    states = [state for state in saved.values() if beside and isinstance(state, dict) and "updates" in state]
    for state in states:
        folder = state.get("buffer_folder")
        if folder is not None and not (path.parent / folder).is_dir():
            return f"its replay buffer's folder {folder} is not beside it (keep the folder with its checkpoint)"
        base = beside_base(path, state)
        found = damage(path.parent, sorted(path.parent.glob(f"{glob.escape(base.name)}.sums-rank*-step{updates}")))
        if found is not None:
            return found
    return None


def remove_path(path: Path) -> None:
    """Delete ``path``, a file or a folder with everything in it (nothing if it is gone already)."""
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def write_folder_atomically(folder: Path, write: Callable[[Path], Any], needed: int = 0) -> Any:
    """``write(temporary)`` fills a temporary folder beside ``folder``, whose files are then flushed to disk and
    which is renamed into place (one rename: a process killed meanwhile leaves either no folder or a whole one; its
    temporary is deleted by ``FrameCheckpoint`` when the next fit starts). Returns what ``write`` returns.

    Raises:
        CheckpointWriteError: fewer than ``needed`` bytes free, or a write failed; the temporary is removed.
    """
    temporary = folder.with_name(f".{folder.name}{TEMPORARY_MARK}{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        check_space(folder.parent, needed)
        temporary.mkdir()
        result = write(temporary)
        for file in temporary.rglob("*"):
            if file.is_file():
                _fsync(file)
        if folder.exists():  # the same update written again (a run resumed from an earlier checkpoint)
            shutil.rmtree(folder)
        os.replace(temporary, folder)
    except CheckpointWriteError:
        raise
    except OSError as error:
        raise write_error(folder.parent, needed, error) from error
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return result


def to_plain(td: TensorDictBase | None) -> dict | None:
    """A TensorDict as nested dicts of tensors, so checkpoints stay loadable with ``weights_only=True``."""
    return None if td is None else td.to_dict()


def from_plain(data: dict | None, batch_dims: int, device: torch.device) -> TensorDictBase | None:
    return None if data is None else TensorDict.from_dict(data, batch_dims=batch_dims, device=device)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary checkpoint files (and the folders of stores beside checkpoints) in ``folder`` whose
    writing process is gone; return what was deleted.

    A file whose process is still alive (another run writing into the same folder) is left alone. The check is by
    process id on this machine, which is where the writer of a local checkpoint folder ran.
    """
    removed = []
    for path in Path(folder).glob(f".*{TEMPORARY_MARK}*"):
        pid = path.name.rpartition(TEMPORARY_MARK)[2]
        if pid.isdigit() and not process_alive(int(pid)):
            remove_path(path)
            removed.append(path)
    return removed


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True
