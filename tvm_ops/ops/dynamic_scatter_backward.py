"""dynamic_scatter_backward (mmcv dynamic_point_to_voxel backward, MVXNet).

v = point2voxel_map[n]; a point takes part when 0 <= v < voxel_num (voxel_num <= M).
- max: the gradient of (voxel v, channel c) goes whole to the smallest point index n
  with map[n] == v and feats[n, c] == voxel_feats[v, c] (exact equality: NaN never
  matches); every other entry is 0; no match -> nothing is written.
- sum: grad_feats[n] = grad_voxel_feats[v]; mean: the same divided by voxel_points_count[v].
Contract: specs/dynamic_scatter_backward.yaml.

The mlu-ops structure: a traceback kernel finds, per (voxel, channel), the winning point
index in an int32 workspace reduce_from[M, C] (sentinel N = no match), then a scatter
kernel sends each voxel's gradient to that point. The traceback is written as a
min-reduction, so it is order-free: any schedule (channel owners on a CPU, atomicMin on a
GPU, any thread count) gives the same bits. The scatter is written in its owner-computes
(gather) form: each point owns its output row and takes g[v, c] exactly when
reduce_from[v, c] == n, which is bit-identical to mlu-ops' scatter (each (v, c) names one
point) and writes every output element once: no zero-fill, no write conflicts.
All indexed accesses sit under the validity test of v, and reduce_from is compared, never
used as an index, so no input (map entries of -1, >= voxel_num, >= M) reaches outside a buffer.
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from ..errors import BadParamError
from ..interop import zero as _zero
from .base import Operator, peer_tensor

KERNELS_FOR = {
    "max": ("max_init", "max_traceback", "max_scatter"),
    "sum": ("sum_scatter",),
    "mean": ("mean_scatter",),
}


def kernel_computes(dtype: str) -> dict:
    """Schedule-free TensorIR of the five kernels; N, M and C stay symbolic and
    voxel_num is a runtime int32 argument of every kernel that reads voxels."""

    @T.prim_func(s_tir=True)
    def max_init(reduce_from_h: T.handle, n_points: T.int32):
        T.func_attr({"tirx.noalias": True})
        M, C = T.int32(), T.int32()
        reduce_from = T.match_buffer(reduce_from_h, (M, C), "int32")
        for m, c in T.grid(M, C):
            with T.sblock("init"):
                vm, vc = T.axis.remap("SS", [m, c])
                reduce_from[vm, vc] = n_points

    @T.prim_func(s_tir=True)
    def max_traceback(feats_h: T.handle, voxel_feats_h: T.handle, map_h: T.handle,
                      reduce_from_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        feats = T.match_buffer(feats_h, (N, C), dtype)
        voxel_feats = T.match_buffer(voxel_feats_h, (M, C), dtype)
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        reduce_from = T.match_buffer(reduce_from_h, (M, C), "int32")
        for n, c in T.grid(N, C):
            with T.sblock("traceback"):
                # n is a min-reduction into reduce_from as max_init left it (hence the
                # empty init); the row written is data-dependent.
                vn, vc = T.axis.remap("RS", [n, c])
                T.reads(point2voxel_map[vn], feats[vn, vc], voxel_feats[0:M, vc], reduce_from[0:M, vc])
                T.writes(reduce_from[0:M, vc])
                with T.init():
                    T.evaluate(0)
                v = T.Bind(point2voxel_map[vn])  # an immutable let: keeps the channel loop vectorisable
                if 0 <= v and v < T.min(voxel_num, M):
                    reduce_from[v, vc] = T.min(reduce_from[v, vc],
                                               T.Select(feats[vn, vc] == voxel_feats[v, vc], vn, N))

    @T.prim_func(s_tir=True)
    def max_scatter(grad_voxel_feats_h: T.handle, reduce_from_h: T.handle, map_h: T.handle,
                    grad_feats_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
        reduce_from = T.match_buffer(reduce_from_h, (M, C), "int32")
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
        for n, c in T.grid(N, C):
            with T.sblock("scatter"):
                vn, vc = T.axis.remap("SS", [n, c])
                T.reads(point2voxel_map[vn], reduce_from[0:M, vc], grad_voxel_feats[0:M, vc])
                T.writes(grad_feats[vn, vc])
                v = T.Bind(point2voxel_map[vn])
                if 0 <= v and v < T.min(voxel_num, M):
                    grad_feats[vn, vc] = T.Select(reduce_from[v, vc] == vn, grad_voxel_feats[v, vc],
                                                  T.cast(0, dtype))
                else:
                    grad_feats[vn, vc] = T.cast(0, dtype)

    @T.prim_func(s_tir=True)
    def sum_scatter(grad_voxel_feats_h: T.handle, map_h: T.handle, grad_feats_h: T.handle,
                    voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
        for n, c in T.grid(N, C):
            with T.sblock("scatter"):
                vn, vc = T.axis.remap("SS", [n, c])
                T.reads(point2voxel_map[vn], grad_voxel_feats[0:M, vc])
                T.writes(grad_feats[vn, vc])
                v = T.Bind(point2voxel_map[vn])
                if 0 <= v and v < T.min(voxel_num, M):
                    grad_feats[vn, vc] = grad_voxel_feats[v, vc]
                else:
                    grad_feats[vn, vc] = T.cast(0, dtype)

    @T.prim_func(s_tir=True)
    def mean_scatter(grad_voxel_feats_h: T.handle, count_h: T.handle, map_h: T.handle,
                     grad_feats_h: T.handle, voxel_num: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, M, C = T.int32(), T.int32(), T.int32()
        grad_voxel_feats = T.match_buffer(grad_voxel_feats_h, (M, C), dtype)
        voxel_points_count = T.match_buffer(count_h, (M,), "int32")
        point2voxel_map = T.match_buffer(map_h, (N,), "int32")
        grad_feats = T.match_buffer(grad_feats_h, (N, C), dtype)
        for n, c in T.grid(N, C):
            with T.sblock("scatter"):
                vn, vc = T.axis.remap("SS", [n, c])
                T.reads(point2voxel_map[vn], voxel_points_count[0:M], grad_voxel_feats[0:M, vc])
                T.writes(grad_feats[vn, vc])
                v = T.Bind(point2voxel_map[vn])
                if 0 <= v and v < T.min(voxel_num, M):
                    grad_feats[vn, vc] = grad_voxel_feats[v, vc] / T.cast(voxel_points_count[v], dtype)
                else:
                    grad_feats[vn, vc] = T.cast(0, dtype)

    return {"max_init": max_init, "max_traceback": max_traceback, "max_scatter": max_scatter,
            "sum_scatter": sum_scatter, "mean_scatter": mean_scatter}


def voxel_num_value(voxel_num):
    """None, an int, or a one-element int32 array/tensor -> None or a Python int (or the
    value unchanged for the generic integer check to reject)."""
    if voxel_num is None or isinstance(voxel_num, (bool, np.bool_, int, np.integer)):
        return voxel_num
    if isinstance(voxel_num, np.ndarray) or hasattr(voxel_num, "__dlpack__"):
        shape = tuple(voxel_num.shape)
        dtype = str(voxel_num.dtype).replace("torch.", "")
        if dtype != "int32":
            raise BadParamError(f"dynamic_scatter_backward: voxel_num must be an int or a one-element "
                                f"int32 array, got dtype {dtype}")
        if int(np.prod(shape)) != 1:
            raise BadParamError(f"dynamic_scatter_backward: voxel_num must be an int or a one-element "
                                f"int32 array, got shape {list(shape)}")
        return int(voxel_num.reshape(-1)[0].item() if hasattr(voxel_num, "item") else voxel_num.reshape(-1)[0])
    return voxel_num  # not an integer: the spec's check names it


def _grouped_max(values: np.ndarray, groups: np.ndarray, count: int, fill: float) -> np.ndarray:
    """out[g] = max(values[groups == g]) along axis 0 (NaN propagates), `fill` for empty groups."""
    out = np.full((count,) + values.shape[1:], fill, values.dtype)
    if groups.size == 0:
        return out
    order = np.argsort(groups, kind="stable")
    g, vals = groups[order], values[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    out[g[starts]] = np.maximum.reduceat(vals, starts, axis=0)
    return out


class DynamicScatterBackward(Operator):
    name = "dynamic_scatter_backward"
    kernel_names = ("max_init", "max_traceback", "max_scatter", "sum_scatter", "mean_scatter")

    # --- contract -----------------------------------------------------------
    def rules(self, problem):
        sizes = problem.sizes
        if sizes["N"] < sizes["M"]:
            raise BadParamError(f"{self.name}: feats.shape[0] (N) must be >= grad_voxel_feats.shape[0] "
                                f"(M) = {sizes['M']}, got {sizes['N']}")
        voxel_num = problem.params.get("voxel_num")
        if voxel_num is None:
            voxel_num = sizes["M"]
        if voxel_num > sizes["M"]:
            raise BadParamError(f"{self.name}: voxel_num must be <= M (voxel_feats.shape[0]) = "
                                f"{sizes['M']}, got {voxel_num}")
        problem.notes["voxel_num"] = voxel_num

    # --- kernels ------------------------------------------------------------
    def plan(self, model, knobs):
        if model.kind == "cuda":
            threads = int(knobs["threads"])
            if threads % 32 or threads > 1024:
                raise ValueError(f"threads must be a multiple of 32 up to 1024, got {threads}")
            return {"threads_x": 32, "threads_y": threads // 32}
        # channels per owner step: whole SIMD registers (the NFU width x lanes_mult)
        return {"vec": model.lanes("float32") * int(knobs["lanes_mult"]),
                "unroll_points": int(knobs["unroll_points"])}

    def computes(self, dtype, plan, model):
        return kernel_computes(dtype)

    def workspaces(self, problem, plan):
        if problem.params["reduce_type"] != "max" or problem.notes["voxel_num"] == 0:
            return {}
        # the traceback: the index of the first point reaching each (voxel, channel) maximum,
        # M*C*4 bytes (mlu-ops uses N*C*4)
        return {"reduce_from": ((problem.sizes["M"], problem.sizes["C"]), "int32")}

    def launch(self, kernels, problem, tensors):
        voxel_num = problem.notes["voxel_num"]
        reduce_type = problem.params["reduce_type"]
        out = tensors["grad_feats"]
        if voxel_num == 0:  # no voxel takes part: all zeros, no kernel
            _zero(out)
            return
        p2v, g = tensors["point2voxel_map"], tensors["grad_voxel_feats"]
        if reduce_type == "max":
            reduce_from = tensors["reduce_from"]
            kernels["max_init"](reduce_from, problem.sizes["N"])
            kernels["max_traceback"](tensors["feats"], tensors["voxel_feats"], p2v, reduce_from, voxel_num)
            kernels["max_scatter"](g, reduce_from, p2v, out, voxel_num)
        elif reduce_type == "sum":
            kernels["sum_scatter"](g, p2v, out, voxel_num)
        else:
            kernels["mean_scatter"](g, tensors["voxel_points_count"], p2v, out, voxel_num)

    # --- testing and benchmarking ---------------------------------------------
    def make_inputs(self, case, dtype, rng):
        """Points spread over voxels (every voxel gets a point first, unless dropped), then the
        forward's max per voxel as voxel_feats, so exact matches exist. extra: reduce_type,
        voxel_num, dropped (points mapped to -1), ties (features rounded to few integers),
        nan (fraction of feats and of voxel_feats set to NaN), map_high (map entries up to it)."""
        s, extra = case.shape, case.extra
        N, M, C = s["N"], s["M"], s["C"]
        if extra.get("ties"):
            feats = rng.integers(-2, 3, (N, C)).astype(dtype)
        else:
            feats = rng.uniform(-1, 1, (N, C)).astype(dtype)
        p2v = np.concatenate([rng.permutation(M), rng.integers(0, max(M, 1), max(N - M, 0))])[:N]
        p2v = rng.permutation(p2v).astype(np.int32) if M else np.full(N, -1, np.int32)
        dropped = int(extra.get("dropped", 0))
        if dropped:
            p2v[rng.choice(N, dropped, replace=False)] = -1
        if extra.get("map_high"):
            wild = rng.random(N) < 0.1
            p2v[wild] = rng.integers(-5, int(extra["map_high"]), int(wild.sum()))
        nan = float(extra.get("nan", 0))
        if nan:
            feats[rng.random((N, C)) < nan] = np.nan
        kept = (p2v >= 0) & (p2v < M)
        voxel_feats = _grouped_max(feats[kept], p2v[kept].astype(np.int64), M, -1e30).astype(dtype)
        empty = np.bincount(p2v[kept], minlength=M)[:M] == 0
        voxel_feats[empty] = rng.uniform(-1, 1, (int(empty.sum()), C)).astype(dtype)
        if nan:
            voxel_feats[rng.random((M, C)) < nan] = np.nan
        count = np.bincount(p2v[kept], minlength=M)[:M].astype(np.int32)
        grad = rng.uniform(-1, 1, (M, C)).astype(dtype)
        inputs = {"grad_voxel_feats": grad, "feats": feats, "voxel_feats": voxel_feats,
                  "point2voxel_map": p2v, "voxel_points_count": count}
        return inputs, {"voxel_num": extra.get("voxel_num"), "reduce_type": extra.get("reduce_type", "max")}

    def reference(self, inputs, params):
        """float64, from SPEC_NOTES. mean: the exact quotient rounded once to the output dtype
        (the best a float32 result can be, so the spec can ask diff3 == 0 of every mode)."""
        g = np.asarray(inputs["grad_voxel_feats"], np.float64)
        feats, voxel_feats = np.asarray(inputs["feats"]), np.asarray(inputs["voxel_feats"])
        p2v = np.asarray(inputs["point2voxel_map"]).astype(np.int64)
        N, C = feats.shape
        M = voxel_feats.shape[0]
        voxel_num = M if params.get("voxel_num") is None else int(np.asarray(params["voxel_num"]).reshape(-1)[0])
        out = np.zeros((N, C), np.float64)
        pts = np.flatnonzero((p2v >= 0) & (p2v < min(voxel_num, M)))
        vox = p2v[pts]
        reduce_type = params.get("reduce_type", "max")
        if reduce_type == "sum":
            out[pts] = g[vox]
        elif reduce_type == "mean":
            count = np.asarray(inputs["voxel_points_count"], np.float64)[vox][:, None]
            out[pts] = (g[vox] / count).astype(feats.dtype)
        else:
            # winner of (v, c): the smallest n among exact matches -> sort matches by (v, c, n)
            point, channel = np.nonzero(feats[pts] == voxel_feats[vox])  # NaN never matches
            n_idx, v_idx = pts[point], vox[point]
            key = v_idx * C + channel
            order = np.lexsort((n_idx, key))
            key, n_idx, v_idx, channel = key[order], n_idx[order], v_idx[order], channel[order]
            first = np.r_[True, key[1:] != key[:-1]] if key.size else np.zeros(0, bool)
            out[n_idx[first], channel[first]] = g[v_idx[first], channel[first]]
        return {"grad_feats": out}

    def torch_peer(self, inputs, params):
        """PyTorch eager computing the same rule (max: scatter_reduce amin + scatter)."""
        import torch

        g, f, vf, p2v, count = (peer_tensor(inputs[k]) for k in (
            "grad_voxel_feats", "feats", "voxel_feats", "point2voxel_map", "voxel_points_count"))
        N, C = f.shape
        M = vf.shape[0]
        voxel_num = M if params.get("voxel_num") is None else int(params["voxel_num"])
        reduce_type = params.get("reduce_type", "max")

        def run():
            p = p2v.long()
            valid = (p >= 0) & (p < voxel_num)
            idx = torch.where(valid, p, 0)
            if reduce_type != "max":
                gg = g[idx] if reduce_type == "sum" else g[idx] / count[idx].to(g.dtype)[:, None]
                return gg * valid[:, None]
            match = (f == vf[idx]) & valid[:, None]
            cand = torch.where(match, torch.arange(N).unsqueeze(1), N)
            rf = torch.full((M, C), N, dtype=torch.long).scatter_reduce_(
                0, idx.unsqueeze(1).expand(N, C), cand, "amin")[:voxel_num]
            out = torch.zeros((N + 1, C), dtype=g.dtype)  # row N collects "no match"
            out.scatter_(0, rf, g[:voxel_num])
            return out[:N]

        return run


OP = DynamicScatterBackward()


def dynamic_scatter_backward(grad_voxel_feats, feats, voxel_feats, point2voxel_map, voxel_points_count,
                             voxel_num=None, reduce_type="max", *, target="llvm", out=None):
    """Gradient of mmcv's dynamic_point_to_voxel: grad_feats [N, C] from grad_voxel_feats [M, C].

    feats [N, C] and voxel_feats [M, C] (the forward's output) are float32;
    point2voxel_map [N] (-1 = dropped point) and voxel_points_count [M] are int32.
    voxel_num (valid voxels, <= M; an int or a one-element int32 array) defaults to M.
    reduce_type "max" (bit-exact: the smallest matching point index takes the whole
    gradient), "sum" or "mean". numpy in -> numpy out; torch in -> torch out; `out=` writes
    into a caller buffer of shape [N, C].
    """
    return OP.call({"grad_voxel_feats": grad_voxel_feats, "feats": feats, "voxel_feats": voxel_feats,
                    "point2voxel_map": point2voxel_map, "voxel_points_count": voxel_points_count},
                   {"voxel_num": voxel_num_value(voxel_num), "reduce_type": reduce_type}, target,
                   {"grad_feats": out})
