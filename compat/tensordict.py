"""tensordict's private API: the constructor without checks, and the process-wide holder of the interaction type.

- ``TensorDict._new_unsafe`` builds a TensorDict from a dict of tensors without validating shapes or devices: an
  environment whose step output is right by construction skips that cost on every step; ``TensorDict._tensordict``
  (its top-level entries, a dict) and ``_set_str(..., validated=True)`` read and write one without the per-key checks
  of the public ``items`` and ``set`` (the environments' step: ``compat/torchrl.py``, ``FastStepAndMaybeReset``; a
  round's steps stacked: :func:`stack_steps`);
- tensordict keeps its interaction type (which TorchRL's exploration type is) in one process-wide holder,
  ``tensordict.nn.probabilistic._interaction_type``, an instance of ``tensordict.utils._ContextManager``, and every
  TorchRL loss sets it to "deterministic" for the length of its forward pass: a collection running in another thread
  meanwhile would act greedily (and a loss could read a collector's "random"). :func:`own_interaction_type` gives a
  thread a value of its own, as TorchRL 0.14 already does for its recurrent mode (a context variable, read as the
  plain attribute while Dynamo traces); other threads, and compiled code, read and write the holder as before;
- ``TensorDict.from_any``, which every ``TensorDictModule`` calls on each tensor it writes, returns a tensor unchanged
  only after asking the import system whether pandas is installed (``importlib.util.find_spec``, a search of
  ``sys.path`` on disk: about 30 µs per call, where pandas is absent); :func:`install_from_any_tensor_shortcut`
  returns a tensor at once, as the original ends up doing (public API, patched in place).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import probabilistic
from tensordict.utils import _ContextManager
from torch.compiler import is_dynamo_compiling

DISTRIBUTION = "tensordict"
#: The tensordict version every function here was written against (tests/app/test_compat.py: same minor, any patch).
WRITTEN_AGAINST = "0.14.3"

#: Every private name used here: (where it lives, the name, the function of this module that uses it).
PRIVATE_API = (
    ("tensordict.TensorDict", "_new_unsafe", "tensordict_unchecked"),
    ("tensordict.TensorDict", "_tensordict", "top_level_entries, stack_steps"),
    ("tensordict.TensorDict", "_set_str", "set_unchecked"),
    ("tensordict.nn.probabilistic", "_interaction_type", "own_interaction_type"),
    ("tensordict.utils", "_ContextManager", "own_interaction_type"),
    ("tensordict.utils._ContextManager", "get_mode", "own_interaction_type"),
    ("tensordict.utils._ContextManager", "set_mode", "own_interaction_type"),
)


def tensordict_unchecked(
    source: dict[str, torch.Tensor], batch_size: torch.Size, device: torch.device | None
) -> TensorDict:
    """``TensorDict(source, batch_size, device)`` without its checks: the caller guarantees the shapes and devices."""
    # TensorDict._new_unsafe (private; tensordict 0.14.3).
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)


def stack_steps(steps: list[TensorDictBase]) -> TensorDictBase:
    """``torch.stack(steps, dim=-1)``: a round's steps, entry by entry where every step is a plain ``TensorDict`` of
    the same entries (nested ones too) on one device, without the generic stack's checks and key walks (a quarter
    of its time for a CartPole round of 8 copies x 5 steps); anything else is ``torch.stack``'s."""
    stacked = _stacked_entries(steps, steps[0].batch_dims)
    return torch.stack(steps, dim=-1) if stacked is None else stacked


def _stacked_entries(steps: list[Any], dim: int) -> TensorDict | None:
    """``steps`` stacked at batch dimension ``dim`` (a nested tensordict's: its parent's), or None where a step is
    not a plain ``TensorDict`` with the first one's batch size, device and entries."""
    first = steps[0]
    if any(type(step) is not TensorDict or step.batch_size != first.batch_size for step in steps):
        return None
    if any(step.device != first.device for step in steps):
        return None
    entries = [top_level_entries(step) for step in steps]
    if any(len(step) != len(entries[0]) for step in entries):
        return None
    out = {}
    for key, value in entries[0].items():
        values = [step.get(key) for step in entries]
        if isinstance(value, torch.Tensor) and all(isinstance(other, torch.Tensor) for other in values):
            out[key] = torch.stack(values, dim) if len(values) > 1 else value.unsqueeze(dim)  # a round of one step
        elif None in values or isinstance(value, torch.Tensor):
            return None
        else:
            nested = _stacked_entries(values, dim)
            if nested is None:
                return None
            out[key] = nested
    batch = torch.Size([*first.batch_size[:dim], len(steps), *first.batch_size[dim:]])
    return tensordict_unchecked(out, batch, first.device)


def tensor_leaves(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], torch.Tensor]] | None:
    """Every tensor of a plain ``TensorDict`` (nested ones too) with its key path, in the order of ``keys(True,
    True)``, read from the entries' dicts without the key iterators' per-entry checks; None where any node is not a
    plain ``TensorDict`` or holds something else than tensors and tensordicts."""
    if type(data) is not TensorDict:
        return None
    out = []
    for key, value in top_level_entries(data).items():
        if isinstance(value, torch.Tensor):
            out.append(((*prefix, key), value))
            continue
        nested = tensor_leaves(value, (*prefix, key))
        if nested is None:
            return None
        out.extend(nested)
    return out


def top_level_entries(data: TensorDict) -> dict[str, Any]:
    """``data``'s own entries by name (tensors and sub-tensordicts), not a copy: read it, never write it."""
    # TensorDict._tensordict (private; tensordict 0.14.3): a dict subclass holding the top-level entries.
    return data._tensordict


def set_unchecked(data: TensorDict, key: str, value: Any) -> None:
    """``data.set(key, value)`` without its checks: the caller guarantees ``value``'s batch shape and device."""
    # TensorDict._set_str (private; tensordict 0.14.3): what ``set`` calls once a key is a string, after its checks.
    data._set_str(key, value, validated=True, inplace=False, non_blocking=False)


_BACKGROUND = threading.local()  # `interaction_type`: the value of a thread that has its own (set there only)


# tensordict.utils._ContextManager (private; tensordict 0.14.3): the holder's class; get_mode/set_mode its interface.
class _PerThreadInteractionType(_ContextManager):
    # is_dynamo_compiling(), not is_compiling(): the latter is a process-wide flag, True in every thread while any
    # thread compiles, which would hand the prefetch thread the training thread's value during a recompilation;
    # the former is False at run time in every thread and True only while Dynamo traces.
    def get_mode(self) -> Any:
        if is_dynamo_compiling() or not hasattr(_BACKGROUND, "interaction_type"):
            return super().get_mode()
        return _BACKGROUND.interaction_type

    def set_mode(self, mode: Any) -> None:
        if is_dynamo_compiling() or not hasattr(_BACKGROUND, "interaction_type"):
            super().set_mode(mode)
        else:
            _BACKGROUND.interaction_type = mode


def own_interaction_type(mode: Any = None) -> None:
    """Give the calling thread an interaction type of its own, starting at ``mode`` (None: TorchRL's default,
    explore); the other threads keep sharing the process-wide one."""
    # tensordict.nn.probabilistic._interaction_type (private; tensordict 0.14.3): the process-wide holder, whose
    # class is switched in place so that every reference to it sees the per-thread value.
    holder = probabilistic._interaction_type
    if type(holder) is _ContextManager:
        holder.__class__ = _PerThreadInteractionType
    elif not isinstance(holder, _PerThreadInteractionType):  # tensordict is pinned: fail loudly if this ever moves
        raise RuntimeError(f"unexpected interaction-type holder {type(holder).__name__}: prefetch cannot isolate it")
    _BACKGROUND.interaction_type = mode


def install_from_any_tensor_shortcut() -> None:
    """Make ``TensorDict.from_any(tensor)`` return the tensor at once (the module docstring says why); anything else
    goes to the original. Idempotent."""
    original = TensorDict.from_any
    if getattr(original, "tensor_shortcut", False):
        return

    def from_any(cls: type, obj: Any, **kwargs: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj  # what the original returns for a tensor, after its pandas and h5py look-ups
        return original.__func__(cls, obj, **kwargs)

    from_any.tensor_shortcut = True
    TensorDict.from_any = classmethod(from_any)
