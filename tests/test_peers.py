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
