"""TensorIR computes of dynamic_scatter_backward: schedule-free, scheduled per target by
schedule.py (the CUDA traceback becomes an atomicMin there)."""

from __future__ import annotations

from tvm.script import tirx as T

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
