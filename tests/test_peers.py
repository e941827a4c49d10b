"""Every PyTorch formulation the bench times computes what the op computes (the ratio is
only honest against a peer that does the same work)."""

import numpy as np
import pytest

from tvm_ops import metrics, runner
from tvm_ops.ops import NAMES, get
from tvm_ops.testing import material

from .conftest import requires_torch


@requires_torch
@pytest.mark.parametrize("name", NAMES)
def test_every_peer_matches_the_reference(name):
    op = get(name)
    testing = material(op)
    case = next(c for c in op.spec.cases if c.expect == "ok" and not c.heavy and all(c.shape.values()))
    inputs, params = testing.make_inputs(case, "float32", runner.case_rng(name, case.name, "float32"))
    reference = testing.reference(inputs, params)
    peers = testing.peers(inputs, params)
    assert peers
    names = [t.name for t in op.spec.outputs]
    for peer, run in peers.items():
        outputs = run()
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        for output, value in zip(names, outputs):  # ms_deform's peer also returns its inputs' gradients only
            accuracy = metrics.accuracy(np.asarray(value.detach().numpy(), np.float64), reference[output], "float32")
            assert accuracy.failures(op.spec.accuracy["float32"]) == [], (peer, output)


@requires_torch
@pytest.mark.parametrize("name", NAMES)
def test_peers_make_their_tensors_on_the_default_device(name):
    """The bench runs the peers under `with torch.device("cuda")` on a GPU: a tensor made on
    the CPU inside one fails there only. Meta tensors show it anywhere; a peer whose shapes
    follow the data (nonzero, unique) cannot run on them and is left out."""
    import torch

    op = get(name)
    testing = material(op)
    case = next(c for c in op.spec.cases if c.expect == "ok" and not c.heavy and all(c.shape.values()))
    inputs, params = testing.make_inputs(case, "float32", runner.case_rng(name, case.name, "float32"))
    ran = []
    with torch.device("meta"):
        for peer, run in testing.peers(inputs, params).items():
            try:
                outputs = run()
            except NotImplementedError:  # a data-dependent shape
                continue
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            assert all(value.device.type == "meta" for value in outputs), peer
            ran.append(peer)
    if not ran:
        pytest.skip(f"every peer of {name} has shapes that follow the data (meta tensors hold none)")
