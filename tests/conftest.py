import torch

# Tests are small: one intra-op thread keeps them fast and repeatable on a 2-core machine.
torch.set_num_threads(1)
