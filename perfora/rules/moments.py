"""Correlations from summed moments, so that statistics gathered on several ranks (or batches)
combine by one sum before the division."""

from __future__ import annotations

import torch


def abs_correlation(moments: torch.Tensor) -> torch.Tensor:
    """|corr(d, e)| from summed moments stacked on dim 0: [count, Sd, Se, Sdd, See, Sde].

    Zero where either variance is zero; works elementwise over any trailing shape."""
    count, sd, se, sdd, see, sde = moments.unbind(0)
    count = count.clamp_min(1)
    cov = sde / count - sd * se / count ** 2
    var = (sdd / count - (sd / count) ** 2).clamp_min(0) * \
        (see / count - (se / count) ** 2).clamp_min(0)
    positive = var > 0
    return torch.where(positive, cov.abs() / torch.where(positive, var, 1.0).sqrt(), 0.0)
