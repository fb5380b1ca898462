"""Per-problem held-out outcomes packed into a string (``eval/correct``): a leaf module, so that
the SFT cache and the metrics both use it without importing each other."""

from __future__ import annotations


def pack_outcomes(correct: list[bool]) -> str:
    """Per-problem outcomes of a held-out evaluation as ``"N:HEX"``: N problems, their bits packed
    most significant first (``eval/correct``; the paired statistics of the findings read it)."""
    bits = "".join("1" if c else "0" for c in correct)
    padded = bits + "0" * (-len(bits) % 8)
    return f"{len(bits)}:" + bytes(int(padded[i : i + 8], 2) for i in range(0, len(padded), 8)).hex()


def unpack_outcomes(packed: str) -> list[bool]:
    """The outcomes :func:`pack_outcomes` packed."""
    count, _, digits = packed.partition(":")
    n = int(count)
    bits = "".join(f"{byte:08b}" for byte in bytes.fromhex(digits))
    if len(bits) < n:
        raise ValueError(f"eval/correct: {len(bits)} bits for {n} problems")
    return [b == "1" for b in bits[:n]]
