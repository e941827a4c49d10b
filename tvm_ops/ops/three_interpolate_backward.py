"""three_interpolate_backward (PointNet++).

grad_features[b, c, m] = sum over (n, k) with indices[b, n, k] == m of
grad_output[b, c, n] * weights[b, n, k]; indices outside [0, M) contribute
nothing. Contract: specs/three_interpolate_backward.yaml.

The compute is mlu-ops' owner-computes plan written as TensorIR: an owner is a
(batch, M-block, C-block) tile of grad_features that accumulates in a float32
on-chip tile while walking all of N, so owners never write the same element.
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from .. import policy
from .base import Operator, peer_tensor


def tiled_compute(dtype: str, m_tile: int, c_tile: int, n_tile: int, scope: str):
    """The kernel for one dtype and tile plan; B, C, N and M stay symbolic."""
    acc_t = "float32"  # float16 accumulates in float32 and rounds once at the end

    @T.prim_func(s_tir=True)
    def three_interpolate_backward(go_h: T.handle, idx_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"global_symbol": "three_interpolate_backward", "tirx.noalias": True})
        B, C, N, M = T.int32(), T.int32(), T.int32(), T.int32()
        grad_output = T.match_buffer(go_h, (B, C, N), dtype)
        indices = T.match_buffer(idx_h, (B, N, 3), "int32")
        weights = T.match_buffer(w_h, (B, N, 3), dtype)
        grad_features = T.match_buffer(out_h, (B, C, M), dtype)
        for b, mb, cb in T.grid(B, T.ceildiv(M, m_tile), T.ceildiv(C, c_tile)):
            with T.sblock("tile"):
                vb, vmb, vcb = T.axis.remap("SSS", [b, mb, cb])
                T.reads(indices[vb, 0:N, 0:3], weights[vb, 0:N, 0:3], grad_output[vb, 0:C, 0:N])
                T.writes(grad_features[vb, vcb * c_tile:vcb * c_tile + c_tile,
                                       vmb * m_tile:vmb * m_tile + m_tile])
                acc = T.alloc_buffer((m_tile, c_tile), acc_t, scope=scope)
                go_t = T.alloc_buffer((n_tile, c_tile), acc_t, scope=scope)
                for nb in range(T.ceildiv(N, n_tile)):
                    # Stage a transposed [n_tile, c_tile] slice; clamped reads past C or N
                    # fill lanes whose results are never stored.
                    for ni, ci in T.grid(n_tile, c_tile):
                        with T.sblock("load"):
                            vnb, vni, vci = T.axis.remap("SSS", [nb, ni, ci])
                            go_t[vni, vci] = T.Cast(acc_t, grad_output[
                                vb, T.min(vcb * c_tile + vci, C - 1), T.min(vnb * n_tile + vni, N - 1)])
                    for ni, k, ci in T.grid(n_tile, 3, c_tile):
                        with T.sblock("scatter"):
                            vn = T.axis.reduce(T.ceildiv(N, n_tile) * n_tile, nb * n_tile + ni)
                            vk, vci = T.axis.remap("RS", [k, ci])
                            T.reads(indices[vb, vn, vk], weights[vb, vn, vk], go_t[vn % n_tile, vci],
                                    acc[0:m_tile, vci])
                            T.writes(acc[0:m_tile, vci])
                            with T.init():
                                for mi in range(T.min(m_tile, M - vmb * m_tile)):
                                    acc[mi, vci] = T.float32(0)
                            if vn < N:
                                j = indices[vb, vn, vk] - vmb * m_tile
                                if 0 <= j and j < m_tile and j + vmb * m_tile < M:
                                    acc[j, vci] = acc[j, vci] + go_t[vn % n_tile, vci] * T.Cast(
                                        acc_t, weights[vb, vn, vk])
                # The channel loop keeps its constant extent (a GPU binds it to threads) and
                # guards the tail instead.
                for ci, mi in T.grid(c_tile, T.min(m_tile, M - vmb * m_tile)):
                    with T.sblock("store"):
                        vci, vmi = T.axis.remap("SS", [ci, mi])
                        if vcb * c_tile + vci < C:
                            grad_features[vb, vcb * c_tile + vci, vmb * m_tile + vmi] = T.Cast(dtype, acc[vmi, vci])

    return three_interpolate_backward


class ThreeInterpolateBackward(Operator):
    name = "three_interpolate_backward"
    kernel_names = ("three_interpolate_backward",)

    def plan(self, model, knobs):
        c_tile, n_tile = int(knobs["c_tile"]), int(knobs["n_tile"])
        budget = int(model.onchip_bytes * knobs["acc_budget"]) - n_tile * c_tile * 4
        # acc[m_tile, c_tile] float32 takes the rest of the on-chip budget (mlu-ops deal_num).
        m_tile = policy.deal_num(max(budget, 0), 1, 4 * c_tile, align=32)
        if m_tile == 0:
            raise ValueError(f"on-chip budget {model.onchip_bytes} B too small for c_tile={c_tile}")
        if knobs.get("m_tile_max"):
            m_tile = min(m_tile, int(knobs["m_tile_max"]))
        return {"m_tile": m_tile, "c_tile": c_tile, "n_tile": n_tile,
                "scope": "shared" if model.kind == "cuda" else "global"}

    def computes(self, dtype, plan, model):
        return {self.kernel_names[0]: tiled_compute(dtype, plan["m_tile"], plan["c_tile"],
                                                    plan["n_tile"], plan["scope"])}

    def launch(self, kernels, problem, tensors):
        kernels[self.kernel_names[0]](tensors["grad_output"], tensors["indices"], tensors["weights"],
                                      tensors["grad_features"])

    # --- testing and benchmarking ---------------------------------------------
    def make_inputs(self, case, dtype, rng):
        s = case.shape
        low = case.extra.get("index_low", 0)
        high = case.extra.get("index_high", max(s["M"], 1))
        grad_output = rng.uniform(-1, 1, (s["B"], s["C"], s["N"])).astype(dtype)
        indices = rng.integers(low, high, (s["B"], s["N"], 3), dtype=np.int64).astype(np.int32)
        weights = rng.uniform(0, 1, (s["B"], s["N"], 3)).astype(dtype)
        return {"grad_output": grad_output, "indices": indices, "weights": weights}, {"m": s["M"]}

    def reference(self, inputs, params):
        go = np.asarray(inputs["grad_output"])
        idx = np.asarray(inputs["indices"]).astype(np.int64)
        w = np.asarray(inputs["weights"], dtype=np.float64)
        m = params["m"]
        batch, channels, points = go.shape
        out = np.zeros((batch, channels, m))
        for b in range(batch):
            target = idx[b].ravel()  # target column of each (n, k)
            keep = (target >= 0) & (target < m)
            point = np.repeat(np.arange(points), 3)[keep]
            order = np.argsort(target[keep], kind="stable")
            target, point, weight = target[keep][order], point[order], w[b].ravel()[keep][order]
            if target.size == 0:
                continue
            contributions = go[b][:, point].astype(np.float64) * weight  # (C, K), grouped by target column
            starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])
            out[b][:, target[starts]] = np.add.reduceat(contributions, starts, axis=1)
        return {"grad_features": out}

    def torch_peer(self, inputs, params):
        """What a PyTorch PointNet++ without custom ops runs: autograd through a gather forward."""
        import torch

        go, idx, w = self._torch_inputs(inputs)
        m = params["m"]
        batch, channels, points = go.shape
        index = idx.long().clamp(0, max(m - 1, 0)).reshape(batch, 1, points * 3).expand(batch, channels, -1)
        weights = w * ((idx >= 0) & (idx < m)).to(w.dtype)

        def run():
            features = torch.zeros(batch, channels, m, dtype=go.dtype, requires_grad=True)
            gathered = torch.gather(features, 2, index).reshape(batch, channels, points, 3)
            (gathered * weights[:, None]).sum(-1).backward(go)
            return features.grad

        return run

    def torch_peers(self, inputs, params):
        return {"torch autograd(gather)": self.torch_peer(inputs, params),
                "scatter_add_": self._scatter_add_peer(inputs, params)}

    def _scatter_add_peer(self, inputs, params):
        """A hand-written backward: the weighted gradients scattered with scatter_add_."""
        import torch

        go, idx, w = self._torch_inputs(inputs)
        m = params["m"]
        batch, channels, points = go.shape
        index = idx.long().clamp(0, max(m - 1, 0)).reshape(batch, 1, points * 3).expand(batch, channels, -1)
        valid = ((idx >= 0) & (idx < m)).to(w.dtype)

        def run():
            contrib = (go[:, :, :, None] * (w * valid)[:, None]).reshape(batch, channels, points * 3)
            return torch.zeros(batch, channels, m, dtype=go.dtype).scatter_add_(2, index, contrib)

        return run

    @staticmethod
    def _torch_inputs(inputs):
        return (peer_tensor(inputs[k]) for k in ("grad_output", "indices", "weights"))


OP = ThreeInterpolateBackward()


def three_interpolate_backward(grad_output, indices, weights, m=None, *, target="llvm", out=None):
    """Gradient of three-NN interpolation: grad_features [B, C, M] from grad_output [B, C, N].

    `indices` / `weights` are [B, N, 3] (int32 / the dtype of grad_output; float32 or
    float16). Indices outside [0, m) contribute nothing. numpy in -> numpy out; torch in ->
    torch out (zero-copy). `out=` writes into a caller buffer of shape [B, C, M], which
    also gives `m` when it is omitted.
    """
    return OP.call({"grad_output": grad_output, "indices": indices, "weights": weights},
                   {"m": m}, target, {"grad_features": out})
