"""Host-to-device copies sharing one node's link: each of n concurrent copies runs at 1/n of the bandwidth
(processor sharing), so n equal copies started together all take n times as long as one alone (Nightjar App. E,
Table 16: 40 ms for one 0.92 GiB draft at 23 GiB/s, 160 ms for four)."""

from __future__ import annotations

# A copy counts as finished within this many bytes: float rounding of times near 100 s times 1e10 bytes/s.
_DONE_BYTES = 1.0


class TransferLink:
    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self._remaining: dict[int, float] = {}  # owner (replica index) -> bytes left
        self._last_s = 0.0

    def __len__(self) -> int:
        return len(self._remaining)

    def add(self, now_s: float, owner: int, num_bytes: float) -> None:
        self._advance(now_s)
        if owner in self._remaining:
            raise RuntimeError(f"owner {owner} already has a copy on this link")
        self._remaining[owner] = float(num_bytes)

    def pop_done(self, now_s: float) -> list[int]:
        """Owners whose copy has finished by ``now_s``, in owner order."""
        self._advance(now_s)
        done = sorted(o for o, left in self._remaining.items() if left <= _DONE_BYTES)
        for owner in done:
            del self._remaining[owner]
        return done

    def next_done_s(self) -> float | None:
        """When the smallest copy in flight finishes if nothing joins; None when idle."""
        if not self._remaining:
            return None
        share = self.bytes_per_s / len(self._remaining)
        return self._last_s + max(min(self._remaining.values()), 0.0) / share

    def _advance(self, now_s: float) -> None:
        if self._remaining and now_s > self._last_s:
            moved = (now_s - self._last_s) * self.bytes_per_s / len(self._remaining)
            for owner in self._remaining:
                self._remaining[owner] -= moved
        self._last_s = max(self._last_s, now_s)
