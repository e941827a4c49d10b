"""Testing material, per operator: inputs generated from a spec case, the float64
reference written from the math, and the PyTorch formulations the bench times.

`runner`, `bench`, the tuner and the tests use it; the call path never imports it.
Each operator's module (named after it) provides

    make_inputs(case, dtype, rng) -> (inputs, params)
    reference(inputs, params) -> {output name: float64 array}
    peers(inputs, params) -> {name: no-argument callable}  (the first is the bench's ratio peer)
"""

from __future__ import annotations

import importlib

import numpy as np


def material(op):
    """The testing module of an operator (an Operator or its name)."""
    return importlib.import_module(f"{__name__}.{getattr(op, 'name', op)}")


def peer_tensor(value):
    """A numpy input as a torch tensor on torch's default device (the peer's device).

    Peers build their tensors with this and torch's factory functions, so under
    `with torch.device("cuda"):` the same peer runs on the GPU."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(value)).to(torch.get_default_device())
