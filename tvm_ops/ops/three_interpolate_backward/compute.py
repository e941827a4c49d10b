"""TensorIR compute of three_interpolate_backward: mlu-ops' owner-computes plan.

An owner is a (batch, M-block, C-block) tile of grad_features that accumulates in a
float32 on-chip tile while walking all of N, so owners never write the same element.
"""

from __future__ import annotations

from tvm.script import tirx as T


def tiled_compute(dtype: str, m_tile: int, c_tile: int, n_tile: int, scope: str, name: str):
    """The kernel `name` for one dtype and tile plan; B, C, N and M stay symbolic."""
    acc_t = "float32"  # float16 accumulates in float32 and rounds once at the end

    @T.prim_func(s_tir=True)
    def three_interpolate_backward(go_h: T.handle, idx_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
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
