"""Core lists as ``engine_cpus`` spells them (``0``, ``0-3``, ``0,2-3``). Pure: the public API's checks, the engine's
environment and the replica's pinning all read them."""

from __future__ import annotations


def parse_cpu_list(text: str) -> set[int]:
    """``"0"``, ``"0-3"`` or ``"0,2-3"`` -> the set of cores; ``ValueError`` naming ``text`` otherwise."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            low, dash, high = part.strip().partition("-")
            first, last = int(low), int(high if dash else low)
            if first < 0 or last < first:
                raise ValueError
            cores |= set(range(first, last + 1))
    except ValueError:
        raise ValueError(f"{text!r}: expected cores such as 0, 0-3 or 0,2-3") from None
    return cores
