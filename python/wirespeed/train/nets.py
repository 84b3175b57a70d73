"""The networks `wirespeed train` trains, built with real weights (a fixed seed, so every rank and
every backend starts from the same ones), and the random batch each rank feeds them.

Vision models are the torchvision entries of models.py's catalogue (the same names `model` knows);
`gpt` is a small decoder-only transformer written here, so no download and no transformers
dependency: pre-norm blocks of causal self-attention and a 4x MLP, learned positions, an untied
output head (a tied one would be one tensor seen twice, which DDP and FSDP handle differently).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UsageError

VISION_CLASSES = 1000   # torchvision's default head, so the gradients are the published model's
INIT_SEED = 0           # weights: the same on every rank and for every backend
DATA_SEED = 1000        # + rank: each rank's own batch


@dataclass(frozen=True)
class NetSpec:
    model: str               # a torchvision catalogue name, or "gpt"
    batch_size: int
    image_size: int = 224
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    seq_len: int = 128
    vocab: int = 1024

    @property
    def unit(self) -> str:
        """What a sample is, in the figures' labels."""
        return "seq" if self.model == "gpt" else "img"

    def describe(self) -> str:
        if self.model == "gpt":
            return (f"gpt ({self.layers} layers, hidden {self.hidden}, {self.heads} heads, "
                    f"seq {self.seq_len}, vocab {self.vocab}), batch {self.batch_size} per rank")
        return f"{self.model} at {self.image_size} px, batch {self.batch_size} per rank"


# The least image side each network's pooling takes in training (inception_v3's auxiliary
# classifier pools a 5x5 window from a map that only 299 px make large enough); others: 32 px.
MIN_IMAGE = {"alexnet": 63, "inception_v3": 299}


def vision_names() -> list[str]:
    from ..workloads.models import CATALOGUE
    return [n for n, (lib, _) in CATALOGUE.items() if lib == "torchvision"]


# The deepest gpt `train` builds: ten times the deepest published transformers' block counts.
MAX_LAYERS = 2048


def check_spec(spec: NetSpec) -> None:
    """What cannot train, refused in one line before any rank starts."""
    if spec.model != "gpt" and spec.model not in vision_names():
        raise UsageError(f"unknown --model {spec.model!r}: choose gpt or one of "
                         f"{', '.join(vision_names())}")
    if spec.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if spec.model == "gpt":
        for flag, v in (("--layers", spec.layers), ("--hidden", spec.hidden),
                        ("--seq-len", spec.seq_len), ("--vocab", spec.vocab), ("--heads", spec.heads)):
            if v < 1:
                raise UsageError(f"{flag} must be at least 1")
        if spec.layers > MAX_LAYERS:   # each block is six modules to build, on the meta device too
            raise UsageError(f"--layers {spec.layers}: wirespeed trains at most {MAX_LAYERS} blocks")
        if spec.hidden % spec.heads:
            raise UsageError(f"--hidden {spec.hidden} must be a multiple of --heads {spec.heads}")
    else:
        least = MIN_IMAGE.get(spec.model, 32)
        if spec.image_size < least:
            raise UsageError(f"--image-size {spec.image_size} is too small for {spec.model}: at "
                             f"least {least} px")
        # BatchNorm in training needs two values per channel; a ResNet's last maps are 1/32 of
        # the image, so one 32-63 px image per rank gives it one.
        if spec.model.startswith("resnet") and spec.batch_size * (spec.image_size // 32) ** 2 < 2:
            raise UsageError(f"--batch-size 1 at {spec.image_size} px leaves {spec.model}'s last "
                             "BatchNorm one value per channel, which cannot train: use --batch-size "
                             "2 or --image-size 64")


class _Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, spec: NetSpec):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.seq_len, spec.hidden)
        self.blocks = nn.ModuleList(_Block(spec.hidden, spec.heads) for _ in range(spec.layers))
        self.ln = nn.LayerNorm(spec.hidden)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def build(spec: NetSpec, device: str) -> nn.Module:
    """The network with its seeded initial weights, on `device`."""
    torch.manual_seed(INIT_SEED)
    if spec.model == "gpt":
        net = GPT(spec)
    else:
        from ..workloads.models import CATALOGUE
        net = CATALOGUE[spec.model][1]()
    return net.to(device)


def blocks_of(net: nn.Module, spec: NetSpec) -> list[nn.Module]:
    """The submodules FSDP shards one by one (each its own all_gather / reduce_scatter), as its
    users do: a transformer's blocks; a torchvision network's top-level stages."""
    if spec.model == "gpt":
        return list(net.blocks)
    return [m for m in net.children() if any(p.requires_grad for p in m.parameters())]


def batch(spec: NetSpec, rank: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's random (inputs, targets), fixed by the seed: the same every run."""
    g = torch.Generator().manual_seed(DATA_SEED + rank)
    if spec.model == "gpt":
        idx = torch.randint(spec.vocab, (spec.batch_size, spec.seq_len + 1), generator=g)
        return idx[:, :-1].to(device), idx[:, 1:].to(device)
    x = torch.randn(spec.batch_size, 3, spec.image_size, spec.image_size, generator=g)
    y = torch.randint(VISION_CLASSES, (spec.batch_size,), generator=g)
    return x.to(device), y.to(device)


def loss_of(net: nn.Module, spec: NetSpec, inputs, targets) -> torch.Tensor:
    out = net(inputs)
    if spec.model == "gpt":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))
    if hasattr(out, "aux_logits"):
        # inception_v3 in training: its auxiliary head weighted 0.4, as its paper and torchvision's
        # reference training do; left out, its parameters would get no gradient and DDP would stop.
        return F.cross_entropy(out.logits, targets) + 0.4 * F.cross_entropy(out.aux_logits, targets)
    return F.cross_entropy(out, targets)
