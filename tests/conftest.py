import pytest
import torch

# Tests are small: one intra-op thread keeps them fast and repeatable on a 2-core machine.
torch.set_num_threads(1)


def pytest_configure(config):
    """Paid once, before the parallel workers start: the Snake environment's C++ kernel, which a fresh checkout
    compiles on first use. Built here, neither worker waits on the other's build inside a test."""
    if not hasattr(config, "workerinput"):  # the controlling process (or a run without workers)
        from envs.snake import cpu_kernel

        cpu_kernel.load()


@pytest.fixture(autouse=True)
def one_thread():
    """Back to one intra-op thread after each test: a test that runs a config in this process takes its ``threads``
    (snake_dqn's and breakout_ppo's are 2), and two threads per worker on a 2-core machine make every later test's
    small ops many times slower while the other worker is busy."""
    yield
    torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """The whole fits (``slow``) first: the parallel workers then end the run on short tests, instead of one worker
    finishing a long fit while the other has nothing left to take."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
