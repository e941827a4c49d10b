"""Reading a plan's numeric and on/off knobs, checked.

A plan's knobs come from the schedule file, from a tuning record (records.py keeps only
records whose every knob is one of the file's candidates) or from a caller that builds a
Variant itself; a plan reads each number through `whole` so that no kernel is built for a
value its loops and buffers are not made for (a task of -1 points, a 16-bit digit in a
14-bit histogram): ValueError, which a record's library turns into a warning and the
hand-tuned default (records._planned).
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
