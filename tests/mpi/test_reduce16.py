"""The float16/bfloat16 MPI user ops against an exact reference, bit for bit.

The reference rounds in float64 with numpy only (no torch): a sum or product of two 16-bit values is
exact in float64 for float16 and for every bfloat16 product; a bfloat16 sum of far-apart exponents
is rounded once at 53 bits first, which cannot change the 8-bit result (53 >= 2*8+2). The rounding
function itself is checked against numpy's own float64 -> float16 conversion.
"""
import numpy as np
import pytest

from wirespeed.backends.mpi import reduce16

# inf - inf and NaN inputs warn in numpy; they are compared like any other value.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# (significand bits incl. the implicit one, smallest normal exponent, largest exponent)
FORMATS = {"float16": (11, -14, 15), "bfloat16": (8, -126, 127)}
N = 1 << 18


def to_f64(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (float64) rounded to nearest even in the 16-bit format, subnormals and overflow included."""
    p, emin, emax = FORMATS[dtype]
    m, e = np.frexp(x)                      # x = m * 2**e, 0.5 <= |m| < 1
    e = np.maximum(e, emin + 1)             # below the normal range the quantum stays fixed
    q = np.rint(np.ldexp(x, p - e))         # rint rounds half to even; the scaling is exact
    y = np.ldexp(q, e - p)
    biggest = (2 - 2.0 ** (1 - p)) * 2.0 ** emax
    y = np.where(np.abs(y) > biggest, np.copysign(np.inf, x), y)
    return np.where(np.isfinite(x), y, x)


def to_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return x.astype(np.float16).view(np.uint16)  # exact: x is already representable
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def edge_values(dtype: str) -> np.ndarray:
    p, emin, emax = FORMATS[dtype]
    one_ulp = 2.0 ** (1 - p)
    vals = [0.0, 1.0, 1.0 + one_ulp, 1.0 + 2 * one_ulp, one_ulp / 2, 3.0, 2.0 ** emin,
            2.0 ** (emin - p + 1), 2.0 ** emin - 2.0 ** (emin - p + 1), (2 - one_ulp) * 2.0 ** emax,
            2.0 ** emax, np.inf]
    vals = np.array(vals + [-v for v in vals])
    return to_bits(round_to(vals, dtype), dtype)


def operands(dtype: str):
    rng = np.random.default_rng(1234)
    a = rng.integers(0, 1 << 16, N, dtype=np.uint32).astype(np.uint16)
    b = rng.integers(0, 1 << 16, N, dtype=np.uint32).astype(np.uint16)
    # Near-equal magnitudes make ties and cancellations, which random patterns rarely hit.
    b[: N // 4] = a[: N // 4] ^ rng.integers(0, 8, N // 4, dtype=np.uint32).astype(np.uint16)
    edges = edge_values(dtype)
    ea, eb = np.meshgrid(edges, edges)
    return np.concatenate([a, ea.ravel()]), np.concatenate([b, eb.ravel()])


def test_reference_rounding_matches_numpy_float16():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(N) * np.exp2(rng.integers(-30, 20, N))
    assert np.array_equal(round_to(x, "float16").astype(np.float16).view(np.uint16),
                          x.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_user_op_is_correctly_rounded(dtype, op):
    a_bits, b_bits = operands(dtype)
    inbuf, inout = bytearray(a_bits.tobytes()), bytearray(b_bits.tobytes())
    reduce16(dtype, op)(memoryview(inbuf), memoryview(inout), None)
    got_bits = np.frombuffer(inout, dtype=np.uint16)
    assert np.array_equal(np.frombuffer(inbuf, dtype=np.uint16), a_bits)  # input untouched
    a, b = to_f64(a_bits, dtype), to_f64(b_bits, dtype)
    exact = {"sum": a + b, "prod": a * b, "min": np.minimum(a, b), "max": np.maximum(a, b)}[op]
    want = round_to(exact, dtype)
    got = to_f64(got_bits, dtype)
    both_nan = np.isnan(want) & np.isnan(got)
    if op in ("sum", "prod"):
        # Bit for bit, signed zeros included.
        same = (to_bits(np.where(np.isnan(want), 0, want), dtype) == got_bits) | both_nan
    else:
        same = (got == want) | both_nan  # min(-0, +0) may be either zero
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (f"{bad.size} wrong, e.g. {a[bad[0]]!r} {op} {b[bad[0]]!r} = "
                           f"{got[bad[0]]!r}, want {want[bad[0]]!r}")


def test_user_op_accepts_empty_pieces():
    reduce16("float16", "sum")(memoryview(bytearray()), memoryview(bytearray()), None)
