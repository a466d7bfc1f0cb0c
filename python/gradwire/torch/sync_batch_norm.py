"""hvd.SyncBatchNorm: batch normalisation whose statistics are those of the whole global batch.

In training, each rank sums its inputs and their squares per channel; one allreduce of
[sum, sum of squares, count] gives the global mean and (biased) variance, so ranks may hold
different batch sizes. Backward allreduces the per-channel sums of dy and dy * x_hat, making the
input gradient that of the global batch's normalisation. The weight and bias gradients stay local
(DistributedOptimizer averages them, as it does every gradient). In eval mode, or on one rank, it
is torch's batch norm.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from . import horovod as _h


def _sum_all(t: torch.Tensor) -> torch.Tensor:
    return _h.synchronize(_h.allreduce_async_(t.contiguous(), op=_h.Sum))


class _SyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Any, bias: Any, running_mean: Any,
                running_var: Any, eps: float, momentum: float) -> torch.Tensor:
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xf = x.float()
        count = float(x.numel() // c)
        stats = torch.cat([xf.sum(dims), (xf * xf).sum(dims),
                           torch.tensor([count], device=x.device)])
        stats = _sum_all(stats.double()).to(x.device)
        total = stats[-1].item()
        if total < 2:
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel across all "
                             f"ranks in training, got input of shape {list(x.shape)}")
        mean = (stats[:c] / total)
        var = (stats[c: 2 * c] / total - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * (total / (total - 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)
        shape = [1, c] + [1] * (x.dim() - 2)
        mean_f, invstd_f = mean.float().view(shape), invstd.float().view(shape)
        xhat = (xf - mean_f) * invstd_f
        y = xhat
        if weight is not None:
            y = y * weight.float().view(shape) + bias.float().view(shape)
        ctx.save_for_backward(xhat, invstd_f, weight)
        ctx.total = total
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        xhat, invstd, weight = ctx.saved_tensors
        c = xhat.shape[1]
        dims = [0] + list(range(2, xhat.dim()))
        shape = [1, c] + [1] * (xhat.dim() - 2)
        dyf = dy.float()
        local = torch.cat([dyf.sum(dims), (dyf * xhat).sum(dims)])
        sums = _sum_all(local.double()).float().to(dy.device)
        mean_dy = (sums[:c] / ctx.total).view(shape)
        mean_dy_xhat = (sums[c:] / ctx.total).view(shape)
        scale = invstd if weight is None else invstd * weight.float().view(shape)
        dx = (scale * (dyf - mean_dy - xhat * mean_dy_xhat)).to(dy.dtype)
        gw = gb = None
        if weight is not None:
            gw = local[c:].to(weight.dtype)
            gb = local[:c].to(weight.dtype) if ctx.has_bias else None
        return dx, gw, gb, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """torch.nn.BatchNorm*d with statistics over every rank's batch (any input of shape
    (N, C, *)). Same arguments as torch.nn.BatchNorm2d."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected at least 2D input, got {x.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if x.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm: input has {x.shape[1]} channels, expected "
                             f"{self.num_features}")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative average
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or not self.track_running_stats
        if not use_batch or not _h.is_initialized() or _h.size() == 1:
            return F.batch_norm(x, self.running_mean if not use_batch or
                                self.track_running_stats else None,
                                self.running_var if not use_batch or
                                self.track_running_stats else None,
                                self.weight, self.bias, use_batch, momentum, self.eps)
        rm = self.running_mean if self.track_running_stats else None
        rv = self.running_var if self.track_running_stats else None
        return _SyncBN.apply(x, self.weight, self.bias, rm, rv, self.eps, momentum)
