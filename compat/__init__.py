"""Every use of a dependency's private API, behind one boundary: one module per dependency.

- :mod:`compat.torch`: the fused and multi-tensor kernels the update calls directly, Inductor's options, AOTInductor;
- :mod:`compat.torchrl`: what an exact resume reads out of TorchRL's collectors, transforms and parallel envs;
- :mod:`compat.tensordict`: the unchecked TensorDict constructor, the interaction type held per thread;
- :mod:`compat.lightning`: Lightning's step and batch counters, its checkpoint and CSV-writer internals;
- :mod:`compat.jsonargparse`: how jsonargparse reads a TorchRL environment's options;
- :mod:`compat.extras`: the command that installs one of the project's optional extras (no private API: the one place
  that spells the distribution's name).

Each module names its distribution (``DISTRIBUTION``), the version it was written against (``WRITTEN_AGAINST``) and
every private name it uses (``PRIVATE_API``: where it lives, the name, the function here that uses it). Each function
holds the private access, with a comment naming the attribute and the version. ``tests/app/test_compat.py`` fails when
an installed version's minor version moves away from ``WRITTEN_AGAINST`` (naming the functions to re-check) or a name in
``PRIVATE_API`` is gone, and asserts that no code outside this package uses these dependencies' private API.

Nothing here imports the project's own packages, and this file imports nothing: the export loader, which needs only
torch, imports :mod:`compat.torch` alone.
"""
