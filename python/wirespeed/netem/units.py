"""Link rates and delays as tc writes them: 1gbit, 300mbit, 100us, 2ms.

Rates are bits per second with decimal prefixes (tc's convention: 1mbit = 1,000,000 bit/s). tc also
reads 'mbps' as megaBYTES per second, a classic trap, so only the unambiguous '...bit' forms are taken.
"""
from __future__ import annotations

import re

from ..errors import UsageError

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}
_NUM_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")

# htb's rate fields are 64-bit, but beyond this a veth on one machine cannot keep up anyway.
MAX_RATE_BPS = 400 * 10**9
MIN_RATE_BPS = 10**5


def parse_rate(text: str, flag: str = "--rate", most: int = MAX_RATE_BPS) -> int:
    """'1gbit' -> 1_000_000_000 (bits per second), at most `most` (a link emulated here: 400gbit)."""
    m = _NUM_UNIT.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _RATE_UNITS:
        raise UsageError(f"{flag} {text!r} does not parse: use a number with kbit, mbit or gbit, "
                         "e.g. 1gbit, 300mbit (tc's units, decimal, bits per second)")
    bps = int(float(m.group(1)) * _RATE_UNITS[unit])
    if not MIN_RATE_BPS <= bps <= most:
        raise UsageError(f"{flag} {text!r} is out of range: use 100kbit .. {most // 10**9}gbit")
    return bps


def parse_delay(text: str, flag: str = "--delay") -> float:
    """'100us' -> 1e-4 (seconds)."""
    m = _NUM_UNIT.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _TIME_UNITS:
        raise UsageError(f"{flag} {text!r} does not parse: use a number with us, ms or s, e.g. 100us")
    s = float(m.group(1)) * _TIME_UNITS[unit]
    if s > 10:
        raise UsageError(f"{flag} {text!r} is more than 10 s: that is not a network")
    return s


def tc_rate(bps: int) -> str:
    """bits per second as tc takes it, exact (tc rounds nothing given plain 'bit')."""
    return f"{bps}bit"


def human_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.0f} bit/s"
