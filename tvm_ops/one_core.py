"""One-core builds of the CPU kernels.

TVM's thread pool has no per-call thread count: a parallel loop hands its iterations to
every worker (TVM_NUM_THREADS, read once per process), wakes those asleep and waits for
all of them. On a small call that costs more than the other cores save (docs/performance.md,
"small calls on one core"). So a CPU library can also be built one-core (the Variant's
`one_core`): the same scheduled TensorIR with its parallel loops made serial, run on the
calling thread without touching the pool. The policy (policy.Policy.one_core) picks it for
a call from the work its spec's theory formulas give and the parallel loops the call runs
(dispatch.runs_on_one_core).

A one-core kernel runs the parallel tasks one after another on one thread; every parallel
loop of these kernels gives each task outputs of its own (owner computes), so it writes
the same bits as the parallel kernel.
"""

from __future__ import annotations

# TVM's CPU code generator: one parallel launch (a closure every thread runs) for the parallel
# loops inside LAUNCH_POINT, a barrier of all its threads after each statement inside BARRIER
LAUNCH_POINT, BARRIER = "pragma_parallel_launch_point", "pragma_parallel_barrier_when_finish"
PARALLEL_LAUNCH_PRAGMAS = (LAUNCH_POINT, BARRIER)


def serial_kernel(func):
    """`func` (a scheduled PrimFunc) with every parallel loop serial and, if it had one, its
    buffer parameters declared aligned to their element only (element_aligned).

    Why the alignment: a parallel loop's body reads its buffers through the launch's
    closure, where LLVM knows nothing of their alignment; made serial, the same body sits in
    the function whose parameters carry TVM's 64-byte declaration, and LLVM then used aligned
    vector moves on a misaligned output and folded a kernel's own alignment test
    (border_align_backward's streamed stores) to true."""
    import tvm_ffi
    from tvm import tirx

    def serial(loop):
        if loop.kind != tirx.ForKind.PARALLEL:
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                        loop.thread_binding, loop.annotations, loop.step, loop.span)

    def outside_any_launch(attr):
        # a launch point and its barriers (TVM's pragmas; one parallel launch for several
        # loops) mean nothing without parallel loops, and TVM refuses a launch without one
        return attr.body if attr.attr_key in PARALLEL_LAUNCH_PRAGMAS else attr

    serial_func = tvm_ffi.structural_map(func, [(tirx.For, serial), (tirx.AttrStmt, outside_any_launch)])
    if serial_func.same_as(func):
        return func  # no parallel loop: the kernel as it is
    return element_aligned(serial_func)


def element_aligned(func):
    """`func` with its buffer parameters declared aligned to their element only.

    TVM declares a parameter's data 64-byte aligned, which the call path does not promise
    (numpy views start anywhere): where LLVM can also prove a vector access's offset a
    multiple of 64 bytes (constant row lengths), it emits aligned moves, which fault on a
    misaligned array."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    def aligned_to_element(function, mutator):
        for param in function.params:
            if getattr(param, "data_alignment", None) is None:
                continue  # a scalar parameter
            element = tvm.DataType(param.dtype)
            mutator.var_remap_set(param, tirx.decl_buffer(
                param.shape, param.dtype, param.name, strides=param.strides, elem_offset=param.elem_offset,
                scope=param.scope(), data_alignment=max(1, element.bits * element.lanes // 8),
                offset_factor=param.offset_factor))
        return mutator.default_mutate(function)

    return tvm_ffi.structural_mutate(func, (tirx.PrimFunc, aligned_to_element))
