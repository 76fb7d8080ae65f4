"""Up-front memory checks: refuse a model or a request that cannot fit before building or compiling anything.

A model config with a 10**9 vocabulary or a request for a million beams would otherwise die in an allocation deep in
TensorFlow (a raw OOM trace, or a machine that swaps); an estimate in bytes against the memory this host has free
answers in microseconds with a message naming what to change. The estimates are lower bounds (weights, KV cache and
logits only), so a refusal is never a false alarm; a request that passes may still be refused by the allocator.
"""

from __future__ import annotations

import os

# Set to a byte count to override the detected memory (tests; hosts whose /proc lies, e.g. some containers).
MEMORY_LIMIT_ENV = "TFGEN_MEMORY_LIMIT_BYTES"


def available_memory_bytes() -> int | None:
    """Bytes this process may still allocate: `TFGEN_MEMORY_LIMIT_BYTES` if set, else the cgroup limit or the
    host's available memory, whichever is smaller; None where neither can be read."""
    override = os.environ.get(MEMORY_LIMIT_ENV)
    if override:
        try:
            return int(override)
        except ValueError:
            raise ValueError(f"{MEMORY_LIMIT_ENV} must be a byte count, got {override!r}") from None
    candidates = [value for value in (_meminfo_available(), _cgroup_limit()) if value is not None]
    return min(candidates) if candidates else None


def format_bytes(count: float) -> str:
    """`count` bytes in the largest binary unit that keeps the number at or above 1 ("1.5 GiB")."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(count) < 1024 or unit == "PiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def check_fits(needed_bytes: float, what: str, advice: str) -> None:
    """Raises ValueError when `needed_bytes` (an estimate for `what`, e.g. "the KV cache of num_beams=1000000")
    exceed the memory available; `advice` says which argument to change."""
    available = available_memory_bytes()
    if available is not None and needed_bytes > available:
        raise ValueError(
            f"{what} needs at least {format_bytes(needed_bytes)} but {format_bytes(available)} is available; {advice}"
        )


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as file:
                text = file.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None
