"""PyTorch's private API: the fused and multi-tensor kernels the update calls directly, Inductor's options and
AOTInductor's packages.

Why private: ``torch._foreach_*`` and ``torch._fused_adam_`` are the kernels behind ``clip_grad_norm_`` and
``torch.optim.Adam(fused=True)``, called without the Python around them (:mod:`modules.optim` says what that
saves); ``torch._inductor`` holds the compile settings with no public spelling (``fallback_random``; a mode's option
dict, since ``torch.compile`` takes ``mode`` or ``options`` but not both) and AOTInductor's package functions;
``torch.nn.modules.batchnorm._BatchNorm`` is the one base of every BatchNorm class.

Imports only torch: :mod:`export.loader` (which needs only torch) uses it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

DISTRIBUTION = "torch"
#: The torch version every function here was written against (tests/app/test_compat.py: same minor version, any patch).
WRITTEN_AGAINST = "2.13.0"

#: Every private name used here: (where it lives, the name, the function of this module that uses it).
PRIVATE_API = (
    ("torch", "_foreach_norm", "clip_grads_by_global_norm_"),
    ("torch", "_foreach_mul_", "clip_grads_by_global_norm_"),
    ("torch", "_foreach_add_", "fused_adam_step_"),
    ("torch", "_fused_adam_", "fused_adam_step_"),
    ("torch", "_foreach_copy_", "foreach_copy_"),
    ("torch", "_foreach_lerp_", "foreach_lerp_"),
    ("torch._inductor.config", "fallback_random", "inductor_fallback_random"),
    ("torch._inductor.cpu_vec_isa", "valid_vec_isa_list", "probe_cpu_vector_isa_early"),
    ("torch._inductor", "list_mode_options", "inductor_mode_options"),
    ("torch._inductor", "aoti_compile_and_package", "aoti_compile_and_package"),
    ("torch._inductor", "aoti_load_package", "aoti_load_package"),
    ("torch.nn.modules.batchnorm", "_BatchNorm", "is_batch_norm"),
    ("torch.nn.modules.module", "_global_forward_hooks", "forward_hooks_set"),
    ("torch.nn.modules.module", "_global_forward_pre_hooks", "forward_hooks_set"),
    ("torch.nn.Module", "_forward_hooks", "forward_hooks_set"),
    ("torch.nn.Module", "_forward_pre_hooks", "forward_hooks_set"),
    ("torch.nn.Module", "_parameters", "own_parameters"),
    ("torch.nn.Module", "_buffers", "own_buffers"),
)


def clip_grads_by_global_norm_(grads: list[torch.Tensor], max_norm: float) -> None:
    """Scale ``grads`` in place so that their global L2 norm is at most ``max_norm``: ``clip_grads_with_norm_``'s
    arithmetic, a factor min(1, max_norm / (norm + 1e-6)), without its grouping by device and dtype."""
    # torch._foreach_norm, torch._foreach_mul_ (private; torch 2.13.0): one multi-tensor kernel each.
    total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total_norm + 1e-6)).clamp_(max=1.0))


def fused_adam_step_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
) -> None:
    """One Adam step (no AMSGrad, not maximizing) of ``params`` in place: the step counters, then the fused kernel
    ``torch.optim.Adam(fused=True)`` calls, on the optimizer's own state tensors."""
    # torch._foreach_add_, torch._fused_adam_ (private; torch 2.13.0): the kernels of torch.optim.adam._fused_adam.
    torch._foreach_add_(steps, 1)
    torch._fused_adam_(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        weight_decay=weight_decay,
        eps=eps,
        amsgrad=False,
        maximize=False,
    )


def foreach_copy_(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target ← source`` for every pair, in place, as one multi-tensor kernel."""
    # torch._foreach_copy_ (private; torch 2.13.0).
    torch._foreach_copy_(targets, sources)


def foreach_lerp_(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float) -> None:
    """``target ← target + weight · (source − target)`` for every pair, in place, as one multi-tensor kernel."""
    # torch._foreach_lerp_ (private; torch 2.13.0).
    torch._foreach_lerp_(targets, sources, weight)


def inductor_fallback_random() -> None:
    """Make compiled code draw random numbers from the global generator as eager code does (process-wide)."""
    # torch._inductor.config.fallback_random (private; torch 2.13.0).
    torch._inductor.config.fallback_random = True


_VECTOR_ISA_PROBE: threading.Thread | None = None


def probe_cpu_vector_isa_early() -> None:
    """Start Inductor's once-a-process check of the vector instruction sets its C++ code for this CPU may use, in a
    background thread, so that the first call of a compiled function finds the answer there.

    Inductor makes the check at the first compilation of a process, its compiled graphs' cache hits included: for
    each candidate set it builds a probe library and loads it in a child Python, and the update waits (about a
    second of a small PPO update's first call on a 2-core machine, docs/history/gymnasium.md). Started while the
    model is built, the children run as the environments are built and the first rollout collected. The answer is
    Inductor's own function's, kept for the process (a call in the main thread before the thread is done makes the
    same check once more), so the compiled code is the same."""
    global _VECTOR_ISA_PROBE
    if _VECTOR_ISA_PROBE is not None:
        return
    # Imported here, in the calling thread: the thread itself only runs the probes (child processes it waits for).
    # torch._inductor.cpu_vec_isa.valid_vec_isa_list (private; torch 2.13.0): the cached list of usable sets.
    from torch._inductor import codecache, cpp_builder, cpu_vec_isa  # noqa: F401 (the probe's own imports)

    _VECTOR_ISA_PROBE = threading.Thread(target=cpu_vec_isa.valid_vec_isa_list, name="vector-isa-probe", daemon=True)
    _VECTOR_ISA_PROBE.start()


def inductor_mode_options(mode: str) -> dict[str, Any]:
    """The Inductor options a ``torch.compile`` mode stands for, to extend and pass as ``options``."""
    # torch._inductor.list_mode_options (private; torch 2.13.0).
    return torch._inductor.list_mode_options(mode)


def aoti_compile_and_package(program: torch.export.ExportedProgram, path: str) -> None:
    """Compile an exported program with AOTInductor into the package file ``path`` (a ``.pt2``)."""
    # torch._inductor.aoti_compile_and_package (private module; torch 2.13.0).
    torch._inductor.aoti_compile_and_package(program, package_path=path)


def aoti_load_package(path: str) -> Callable[..., Any]:
    """Load an AOTInductor package written by :func:`aoti_compile_and_package`."""
    # torch._inductor.aoti_load_package (private module; torch 2.13.0).
    return torch._inductor.aoti_load_package(path)


def is_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a BatchNorm layer of any dimension (lazy and synchronized ones included)."""
    # torch.nn.modules.batchnorm._BatchNorm (private; torch 2.13.0): their common base.
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


def forward_hooks_set(modules: list[nn.Module]) -> bool:
    """Whether a forward hook would run in a call of ``modules``: one of their own, or a global one
    (``nn.modules.module.register_module_forward_hook`` and its pre-hook)."""
    # torch.nn.modules.module._global_forward_hooks, _global_forward_pre_hooks; Module._forward_hooks,
    # _forward_pre_hooks (private; torch 2.13): what Module._call_impl checks before taking its short road.
    module = nn.modules.module
    if module._global_forward_hooks or module._global_forward_pre_hooks:
        return True
    return any(each._forward_hooks or each._forward_pre_hooks for each in modules)


def own_parameters(module: nn.Module) -> dict[str, nn.Parameter | None]:
    """``module``'s own parameters by name: the dict where ``module.weight`` is found, read directly. The attribute
    takes ``nn.Module.__getattr__``'s slow road (after the instance's dict and the class miss), which a layer called
    once a frame on one row (a one-copy loop's acting network) pays twice a layer."""
    # Module._parameters (private; torch 2.13.0): what Module.__getattr__ looks a parameter up in.
    return module._parameters


def own_buffers(module: nn.Module) -> dict[str, torch.Tensor | None]:
    """``module``'s own buffers by name, read directly (:func:`own_parameters` says why)."""
    # Module._buffers (private; torch 2.13.0): what Module.__getattr__ looks a buffer up in.
    return module._buffers
