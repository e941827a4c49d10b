"""Reading a plan's numeric and on/off knobs, checked.

A plan's knobs come from the schedule file, from a tuning record (records.py keeps only
records whose every knob is one of the file's candidates) or from a caller that builds a
Variant itself. A plan whose kernels would corrupt memory or drop work on some number
outside its candidates (a task of -1 points, a 16-bit digit in a 14-bit histogram) reads
that knob through `whole`: ValueError before any kernel is built.
"""

from __future__ import annotations


def whole(knobs: dict, name: str, least: int, most: int) -> int:
    """Knob `name` as an int in [least, most]; ValueError for any other value (a bool too)."""
    value = knobs[name]
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{name} must be an integer from {least} to {most}, got {value!r}")
    return value


def flag(knobs: dict, name: str) -> bool:
    """Knob `name` as a bool; ValueError for any other value (bool("false") would be True)."""
    value = knobs[name]
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
