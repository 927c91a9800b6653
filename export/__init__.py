"""Policy export: trace a trained policy network for fixed-batch inference, check it, benchmark it, load it back.

- :mod:`export.tracing`: :func:`~export.tracing.export_policy`, the backends (Neuron, TorchScript, AOTInductor), the
  equality check against eager and the files it writes;
- :mod:`export.inputs`: what the check feeds (random inputs, the environment's start states, its collocation box);
- :mod:`export.report`: the benchmark (``export_benchmark.json`` / ``.md``);
- :mod:`export.loader`: :class:`~export.loader.TracedPolicy`, which verifies every file's sha256 and serves any
  batch size (needs only torch).

Library code: it imports nothing of the app, the agents, the data modules or the callbacks (tests/app/test_layout.py).
:class:`callbacks.export.PolicyExport` runs the export after ``fit``, and ``lightrl export --ckpt_path ...``
(app/export.py) from a checkpoint alone.
"""
