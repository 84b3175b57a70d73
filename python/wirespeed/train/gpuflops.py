"""`--what-if-gpu NAME`: the step's compute on a GPU instead of this machine's CPU, from FLOPs.

A training step costs about 3 forward passes of FLOPs (the backward pass computes the gradients
of the activations and of the weights: two more of the forward's matrix products). For a GPT
that is the usual 6 x parameters x tokens (2 FLOPs per parameter per token forward; attention's
own products, 12 x layers x hidden x seq per token, are left out as that rule leaves them out);
for a vision network it is 3 x the forward FLOPs of its convolutions and linear layers, counted
on torch's meta device (2 x output elements x inputs per output; batch norm, activations and
pooling are memory-bound and not counted). The GPU does them at its peak dense 16-bit tensor rate
times an assumed model-FLOPs utilisation (MFU): the share of the peak real training reaches.
Both are printed and settable (--gpu-tflops, --gpu-mfu); the table's peaks are the vendors'
dense (no sparsity) fp16/bf16 tensor figures for the SXM parts.
"""
from __future__ import annotations

from ..errors import UsageError

# name -> peak dense fp16/bf16 tensor TFLOPS (SXM)
GPUS = {"V100": 125.0, "A100": 312.0, "H100": 989.0}
DEFAULT_MFU = 0.4


def gpu_rate(name: str, tflops: float | None = None, mfu: float | None = None) -> tuple[str, float, float]:
    """(name, peak TFLOPS, MFU), the table's unless given; a one-line UsageError for an unknown
    name or a share outside (0, 1]."""
    key = str(name).upper()
    if key not in GPUS and tflops is None:
        raise UsageError(f"--what-if-gpu {name}: choose {', '.join(GPUS)}, or give --gpu-tflops")
    peak = GPUS.get(key) if tflops is None else tflops
    share = DEFAULT_MFU if mfu is None else mfu
    if not peak > 0:
        raise UsageError("--gpu-tflops must be positive")
    if not 0 < share <= 1:
        raise UsageError(f"--gpu-mfu {mfu}: a share of the peak, above 0 and at most 1")
    return key, peak, share


def gpt_step_flops(parameters: int, tokens: int) -> float:
    """6 x parameters x tokens: one training step of a transformer over `tokens` tokens."""
    return 6.0 * parameters * tokens


def forward_flops(net, example) -> float:
    """The forward pass's FLOPs of `net`'s convolutions and linear layers on `example` (a meta
    tensor works: nothing is computed)."""
    import torch.nn as nn
    total = [0.0]

    def conv(m, _i, out):
        total[0] += 2.0 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def linear(m, _i, out):
        total[0] += 2.0 * out.numel() * m.in_features
    hooks = [m.register_forward_hook(conv if isinstance(m, nn.Conv2d) else linear)
             for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        net(example)
    finally:
        for h in hooks:
            h.remove()
    return total[0]


def step_flops(spec, parameters: int) -> float:
    """One rank's training step of `spec` (train/nets.NetSpec), in FLOPs."""
    if spec.model == "gpt":
        return gpt_step_flops(parameters, spec.batch_size * spec.seq_len)
    import torch
    from .nets import build
    with torch.device("meta"):
        net = build(spec, "meta")
        x = torch.empty(spec.batch_size, 3, spec.image_size, spec.image_size)
        return 3.0 * forward_flops(net, x)


def gpu_step_us(flops: float, peak_tflops: float, mfu: float) -> float:
    return flops / (peak_tflops * 1e12 * mfu) * 1e6


def on_gpu(pred: dict, compute_us: float) -> dict:
    """A what-if record (train/whatif.StepModel.predicted) with the GPU's compute in place of the
    measured one: the communication as fitted; what compute hid stays hidden up to the new
    compute's length (a shorter compute hides less), and a CPU's slowdown of the two by each
    other (hidden below 0) is not carried to a GPU."""
    hidden = min(max(pred["fitted_on"]["hidden_us"], 0.0), compute_us)
    step = compute_us + max(0.0, pred["comm_us"] - hidden)
    return {**pred, "compute_us": compute_us, "step_us": step,
            "exposed_pct": 100.0 * (step - compute_us) / step,
            "samples_per_s": pred["samples_per_s"] * pred["step_us"] / step}
