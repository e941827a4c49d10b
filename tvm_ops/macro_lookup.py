"""Parse TVMScript with a fast lookup of the parser that expands a T.macro.

A T.macro call finds the parser expanding it by walking the Python stack up to the frame
whose globals hold it (ScriptMacro._find_parser_def). TVM 0.27 walks it with
inspect.getouterframes, which also builds a FrameInfo for every frame: its source file,
module and context line, found by searching sys.modules. In a parse ~100 frames deep that
is ~0.1 s per macro call, most of the parse of the kernels that expand many macros
(border_align_backward's CPU kernels: 7.9 s, 1.6 s with this lookup). fast_macro_lookup
walks the same frames through f_back and returns the same parser, so the parsed
functions are the same (tests/test_build_cache.py compares them structurally).
"""

from __future__ import annotations

import contextlib
import functools
import inspect


def _parser_of_the_enclosing_parse(self):
    """ScriptMacro._find_parser_def: the same frames in the same order, no FrameInfo."""
    name = type(self).parser_object_name
    frame = inspect.currentframe()
    while frame is not None:
        parser = frame.f_globals.get(name)
        if parser is not None:
            return parser
        frame = frame.f_back
    raise RuntimeError(f"{name} not available")


@functools.cache
def _tvm_lookup():
    """(ScriptMacro, TVM's own _find_parser_def), read once: what every exit restores."""
    from tvm.script.parser.core.parser import ScriptMacro

    return ScriptMacro, ScriptMacro.__dict__["_find_parser_def"]


@contextlib.contextmanager
def fast_macro_lookup():
    """TVM's macros find their parser by the fast walk for the duration (the class
    attribute: a parse on another thread meanwhile takes it too, and finds the same)."""
    script_macro, tvm_own = _tvm_lookup()
    script_macro._find_parser_def = _parser_of_the_enclosing_parse
    try:
        yield
    finally:
        script_macro._find_parser_def = tvm_own
