"""Tunable kernel parameters: what a kernel family lets the tuner choose, and labels.

An algorithm may declare ``tunables(problem) -> Space``: for each parameter it reads
(a register tile, a task split, a serial cut-off), the values it accepts on that
problem, the first one its cost-model default. Untuned calls use the defaults; the
tuner (:mod:`convengine.tune`) times other values and keeps one only where it wins
clearly. A choice is stored as a *label*, the algorithm's name with the parameters
that differ from the defaults::

    blocked                 # every parameter at its default
    blocked[nvec=2,tasks=4] # two parameters set

so a tuning cache written before an algorithm had parameters still reads, and a
label whose parameters an algorithm no longer accepts is recognised as such
(:func:`check`) and never applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: parameter name -> accepted values, the default first
Space = dict[str, tuple[int, ...]]
#: parameter name -> chosen value (only those that differ from the default)
Params = Mapping[str, int]

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_LABEL = re.compile(r"(?P<name>[A-Za-z0-9_.\-]+)(\[(?P<params>[^\]]*)\])?\Z")


def label(name: str, params: Params) -> str:
    """``name`` with ``params`` in brackets, sorted by parameter (``name`` alone
    when there are none)."""
    if not params:
        return name
    return f"{name}[{','.join(f'{k}={int(v)}' for k, v in sorted(params.items()))}]"


def parse(text: str) -> tuple[str, dict[str, int]]:
    """(name, params) of a :func:`label`; ValueError naming what is malformed."""
    match = _LABEL.match(text)
    if match is None:
        raise ValueError(f"malformed algorithm label {text!r}: expected name or name[k=v,...]")
    params: dict[str, int] = {}
    body = match.group("params")
    for item in ([] if body is None else body.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not _NAME.match(key) or not re.fullmatch(r"-?[0-9]+", value):
            raise ValueError(f"malformed parameter {item!r} in label {text!r}: expected k=int")
        if key in params:
            raise ValueError(f"parameter {key!r} repeated in label {text!r}")
        params[key] = int(value)
    return match.group("name"), params


def check(space: Space, params: Params) -> str | None:
    """Why ``params`` are not a choice within ``space``, or None."""
    for key, value in params.items():
        if key not in space:
            return f"unknown parameter {key!r} (accepted: {sorted(space)})"
        if value not in space[key]:
            return f"{key}={value} not among {space[key]}"
    return None


def value(space: Space, params: Params | None, key: str) -> int:
    """The value of ``key``: from ``params``, else ``space``'s default."""
    if params and key in params:
        return int(params[key])
    return space[key][0]


def around(budget: int) -> tuple[int, ...]:
    """The values searched for a byte budget derived from a cache size (in KiB):
    the budget first, then a quarter, half and twice it."""
    return (budget, budget // 4, budget // 2, budget * 2)


def alternatives(space: Space) -> list[tuple[str, int]]:
    """Every (parameter, non-default value), parameter by parameter: what a search
    one parameter at a time tries."""
    return [(key, v) for key, values in space.items() for v in values[1:]]
