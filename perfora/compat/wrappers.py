"""Re-wrap a model after a restructure: a new DataParallel/DDP of the same kind and settings."""

from __future__ import annotations

from torch import nn


def rewrap(net: nn.Module) -> nn.Module:
    """``net`` itself for a plain module; a fresh wrapper of the same class and arguments
    around the (grown) inner module for DataParallel and DistributedDataParallel."""
    if isinstance(net, nn.parallel.DistributedDataParallel):
        # the gradient buckets hold the old parameter list: a new wrapper is required
        kwargs = {"device_ids": net.device_ids, "output_device": net.output_device,
                  "dim": net.dim, "broadcast_buffers": net.broadcast_buffers,
                  "process_group": net.process_group,
                  "find_unused_parameters": net.find_unused_parameters,
                  "gradient_as_bucket_view": net.gradient_as_bucket_view,
                  "static_graph": net.static_graph}
        return type(net)(net.module, **kwargs)
    if isinstance(net, nn.DataParallel):
        device_ids = getattr(net, "device_ids", None) or None
        kwargs = {"device_ids": device_ids, "dim": net.dim}
        if device_ids:
            kwargs["output_device"] = net.output_device
        return type(net)(net.module, **kwargs)
    return net
