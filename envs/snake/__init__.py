"""Snake: the batched environment (``env.py``) and its compiled CPU step (``cpu_kernel.py``)."""
