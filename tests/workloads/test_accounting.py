"""The staleness ledger and the exact data: hand-worked cases."""
import torch

from wirespeed.bench.dtypes import DTYPES
from wirespeed.workloads.async_ps import StalenessLedger
from wirespeed.workloads.data import LR, ErrorMeter, fill_grad, fill_weights, grad_divisor, reference


def test_staleness_by_hand():
    led = StalenessLedger()
    # Workers 1 and 2 on bucket 0: 1 pushes (version 0 -> 1), 2 pushes having pulled nothing
    # since the start (1 update missed), 1 pushes again (missed 2's), 1 again (missed none).
    assert [led.apply(1, 0), led.apply(2, 0), led.apply(1, 0), led.apply(1, 0)] == [0, 1, 1, 0]
    # Buckets keep separate versions.
    assert led.apply(2, 5) == 0 and led.apply(2, 0) == 2
    assert led.summary() == (4.0, 2.0, 6.0)
    assert led.version == {0: 5, 5: 1}


def test_lock_step_has_no_staleness():
    led = StalenessLedger()
    for _ in range(10):
        led.apply(1, 0)
    assert led.summary() == (0.0, 0.0, 10.0)


def test_float_steps_equal_the_exact_reference():
    """Summing ranks' gradients in float, in two different orders, and applying sgd step by step
    gives the reference's bits exactly, for every float dtype."""
    for name in ("float32", "float16", "bfloat16", "float64"):
        dt = DTYPES[name]
        world, steps, n, start = 4, 3, 5000, 123
        for opt in (False, True):
            div = grad_divisor(world * steps, opt)
            gs = []
            for r in range(world):
                g = torch.empty(n, dtype=dt.torch)
                fill_grad(g, r, start, dt, div)
                gs.append(g)
            x = torch.empty(n, dtype=dt.torch)
            if opt:
                fill_weights(x, start, dt)
            else:
                x.zero_()
            for s in range(steps):
                for g in (gs if s % 2 else gs[::-1]):
                    if opt:
                        x.add_(g, alpha=-LR)
                    else:
                        x.add_(g)
            exp = reference(range(world), start, n, dt, div, opt, repeats=steps)
            assert torch.equal(x.to(torch.float64), exp), (name, opt)
            assert exp.abs().sum() > 0
            m = ErrorMeter()
            m.add(x, start, lambda s0, c: reference(range(world), s0, c, dt, div, opt, repeats=steps))
            assert ErrorMeter.combine(m.diff, m.norm) == 0.0
            x[7] += 1
            m = ErrorMeter()
            m.add(x, start, lambda s0, c: reference(range(world), s0, c, dt, div, opt, repeats=steps))
            assert ErrorMeter.combine(m.diff, m.norm) > 0.0
