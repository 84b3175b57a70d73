"""The gradients of one training step: the parameter shapes of a real network, or of a shapes file.

Networks are built on torch's meta device, so no weight is allocated or downloaded; only the
shapes are read. The order is `named_parameters()` (shared tensors once), which is also the order
DDP buckets in. The catalogue's parameter counts are checked against the published ones in
tests/workloads/test_models.py.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UsageError


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelShapes:
    name: str
    source: str               # "torchvision", "transformers" or the shapes file
    params: tuple[Param, ...]

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source,
                "params": [[p.name, list(p.shape)] for p in self.params]}

    @classmethod
    def from_json(cls, d: dict) -> "ModelShapes":
        return cls(d["name"], d["source"], tuple(Param(n, tuple(s)) for n, s in d["params"]))


def _torchvision(name: str, **kw) -> Callable[[], object]:
    def build():
        try:
            import torchvision.models as tvm
        except ImportError:
            raise UsageError(f"--model {name} needs torchvision: run `make setup` "
                             "or `pip install torchvision`") from None
        return getattr(tvm, name)(weights=None, **kw)
    return build


def _transformers(kind: str, **config) -> Callable[[], object]:
    def build():
        try:
            import transformers
        except ImportError:
            raise UsageError("this --model needs transformers: run `make setup` "
                             "or `pip install transformers`") from None
        transformers.logging.set_verbosity_error()
        if kind == "gpt2":
            return transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    return build


# name -> (library, builder). inception_v3 keeps its auxiliary classifier, as torchvision's
# published parameter count does; init_weights=False skips the scipy-based init (meaningless on meta).
CATALOGUE: dict[str, tuple[str, Callable[[], object]]] = {
    "resnet18": ("torchvision", _torchvision("resnet18")),
    "resnet50": ("torchvision", _torchvision("resnet50")),
    "resnet152": ("torchvision", _torchvision("resnet152")),
    "vgg16": ("torchvision", _torchvision("vgg16")),
    "alexnet": ("torchvision", _torchvision("alexnet")),
    "inception_v3": ("torchvision", _torchvision("inception_v3", aux_logits=True, init_weights=False)),
    "gpt2": ("transformers", _transformers("gpt2")),
    "gpt2-medium": ("transformers", _transformers("gpt2", n_embd=1024, n_layer=24, n_head=16)),
    # Llama-2-7B's published shape, and TinyLlama-1.1B's (grouped-query attention, 4 KV heads).
    "llama2-7b": ("transformers", _transformers(
        "llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)),
    "tinyllama-1.1b": ("transformers", _transformers(
        "llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)),
}


def model_shapes(name: str) -> ModelShapes:
    """The parameters of a catalogue network, built on the meta device (nothing allocated)."""
    if name not in CATALOGUE:
        raise UsageError(f"unknown model {name!r}: choose from {', '.join(CATALOGUE)} "
                         "(or give --shapes FILE)")
    import torch
    source, build = CATALOGUE[name]
    with torch.device("meta"):
        module = build()
    params = tuple(Param(n, tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad)
    return ModelShapes(name, source, params)


_DIMS = re.compile(r"^\d+(?:\s*[x,*\s]\s*\d+)*$")


def _shape(text: str, where: str) -> tuple[int, ...]:
    text = text.strip().strip("()[]").strip()
    if not _DIMS.match(text):
        raise UsageError(f"{where}: {text!r} is not a shape: write dimensions such as 64x3x7x7 "
                         "or 64,3,7,7 (optionally after a name and a colon)")
    dims = tuple(int(d) for d in re.split(r"[x,*\s]+", text))
    if any(d <= 0 for d in dims):
        raise UsageError(f"{where}: shape {text!r} has a zero dimension")
    return dims


def read_shapes(path: str) -> ModelShapes:
    """A shapes file: JSON (a list of shapes, or {name: shape}) or text, one array per line:
    `[name:] 64x3x7x7`, with `#` comments. Order is the parameter order (first layer first)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"--shapes {path}: cannot read it ({e.strerror})") from None
    params: list[Param] = []
    if text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--shapes {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        items = data.items() if isinstance(data, dict) else ((f"p{i}", s) for i, s in enumerate(data))
        for name, s in items:
            if not (isinstance(s, list) and s and all(isinstance(d, int) and d > 0 for d in s)):
                raise UsageError(f"--shapes {path}: {name}: {s!r} is not a list of positive integers")
            params.append(Param(str(name), tuple(s)))
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, dims = line.rpartition(":")
            params.append(Param(name.strip() or f"p{len(params)}", _shape(dims, f"{path}:{lineno}")))
    if not params:
        raise UsageError(f"--shapes {path}: no shapes in it: write one shape per line, e.g. 64x3x7x7")
    return ModelShapes(p.stem, str(path), tuple(params))
