"""Software prefetch of a run of words, for the CPU kernels whose rows the hardware
prefetchers do not follow (rows a page or more apart)."""

from tvm.script import tirx as T

from ..host_buffers import LINE_BYTES

# 4-byte words in a cache line
LINE_WORDS = LINE_BYTES // 4


@T.macro
def prefetch_words(word, n, write):
    """Prefetch the n words word(0) .. word(n - 1) of a run (word(i): its i-th buffer element)
    into every cache level: one prefetch per 16 words, and one for the last word (a numpy row
    need not start on a line, so n words can span one more)."""
    for i in range((n + LINE_WORDS - 1) // LINE_WORDS):
        T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(word(i * LINE_WORDS)), write, 3, 1))
    T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(word(n - 1)), write, 3, 1))
