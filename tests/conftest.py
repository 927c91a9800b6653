import torch

# Tests are small: one intra-op thread keeps them fast and repeatable on a 2-core machine.
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """The whole fits (``slow``) first: the parallel workers then end the run on short tests, instead of one worker
    finishing a long fit while the other has nothing left to take."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
