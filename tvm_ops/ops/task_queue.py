"""A shared task counter for CPU kernels: tasks handed out one at a time, not split up front.

TVM's parallel loop gives each thread a fixed, contiguous share of the iterations, so when
one core is slower (another process on it, a busy neighbour of a virtual machine) the call
waits for that core's whole share. Here a parallel loop over WORKERS runs workers that each
take the next task from a counter until none is left, so a slow core simply takes fewer.
Which task runs where changes nothing in the results: each task owns its outputs.

TVM's LLVM backend has no atomic builtin; the counter's fetch-and-add is a small LLVM IR
function linked in through the loop annotation `pragma_import_llvm` (inlined by LLVM).
"""

from tvm.script import tirx as T

# Parallel iterations: the runtime splits them over its threads (TVM_NUM_THREADS); a
# worker that finds the counter used up returns at once, so this only has to be at least
# the thread count.
WORKERS = 64

NEXT_TASK_IR = """
define i32 @tvm_ops_next_task(ptr %counter) {
entry:
  %task = atomicrmw add ptr %counter, i32 1 monotonic
  ret i32 %task
}
"""


def worker_annotations(*llvm_ir: str) -> dict:
    """The worker loop's annotations: the counter's LLVM IR, and the kernel's own functions."""
    return {"pragma_import_llvm": NEXT_TASK_IR + "".join(llvm_ir)}


def next_task(counter):
    """The counter's value before adding 1 to it: the caller's task (counter: int32 buffer [1])."""
    return T.call_extern("int32", "tvm_ops_next_task", T.address_of(counter[0]))
