"""The quantile Huber loss QR-DQN and TQC share, against Stable-Baselines3 contrib's."""

from __future__ import annotations

import pytest
import torch

from modules.quantiles import quantile_huber


@pytest.mark.parametrize(("predicted", "targets"), [(10, 10), (5, 7), (1, 3), (25, 46)])
@pytest.mark.parametrize("sum_over_quantiles", [True, False])
def test_the_quantile_huber_loss_is_stable_baselines3_contribs(predicted, targets, sum_over_quantiles):
    # QR-DQN sums over the predicted quantiles (sum_over_quantiles), TQC averages over them; both average the rest.
    utils = pytest.importorskip("sb3_contrib.common.utils")
    torch.manual_seed(0)
    current, target = 3 * torch.randn(16, predicted), 3 * torch.randn(16, targets)
    theirs = utils.quantile_huber_loss(current, target, sum_over_quantiles=sum_over_quantiles)
    pairs = quantile_huber(current, target)
    ours = pairs.sum(-2).mean() if sum_over_quantiles else pairs.mean()
    torch.testing.assert_close(ours, theirs)


def test_a_quantile_settles_at_its_fraction_of_the_targets():
    # Minimising the loss over one quantile's value puts it at the τ-quantile of the targets (Huber near 0 aside).
    targets = torch.linspace(-50, 50, 1001)
    candidates = torch.linspace(-50, 50, 2001)
    for count, index in ((4, 0), (4, 3), (10, 6)):
        predicted = candidates.unsqueeze(-1).expand(-1, count).clone()
        loss = quantile_huber(predicted, targets.expand(len(candidates), -1)).mean(-1)[:, index]
        tau = (index + 0.5) / count
        assert candidates[loss.argmin()].item() == pytest.approx(torch.quantile(targets, tau).item(), abs=1.0)
