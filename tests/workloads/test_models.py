"""The catalogue's networks have their published parameter counts (torchvision's model tables, the
GPT-2, Llama-2-7B and TinyLlama model cards), built on the meta device; shapes files parse or fail
with one line."""
import pytest

from wirespeed.errors import UsageError
from wirespeed.workloads.models import CATALOGUE, model_shapes, read_shapes

PUBLISHED = {
    "resnet18": 11_689_512, "resnet50": 25_557_032, "resnet152": 60_192_808,
    "vgg16": 138_357_544, "alexnet": 61_100_840, "inception_v3": 27_161_264,
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168,
    "llama2-7b": 6_738_415_616, "tinyllama-1.1b": 1_100_048_384,
}


def test_every_catalogue_model_has_its_published_count():
    assert set(PUBLISHED) == set(CATALOGUE)
    for name, count in PUBLISHED.items():
        m = model_shapes(name)
        assert m.numel == count, name
        assert all(p.numel > 0 for p in m.params)


def test_array_counts_and_order():
    r50 = model_shapes("resnet50")
    assert len(r50.params) == 161                       # conv/bn/fc weights and biases
    assert r50.params[0].name == "conv1.weight" and r50.params[0].shape == (64, 3, 7, 7)
    assert r50.params[-1].name == "fc.bias" and r50.params[-1].shape == (1000,)
    gpt2 = model_shapes("gpt2")
    # The LM head shares the token embedding: counted once, as DDP syncs it once.
    assert [p.name for p in gpt2.params].count("transformer.wte.weight") == 1
    assert "lm_head.weight" not in [p.name for p in gpt2.params]


def test_shapes_file_text_and_json(tmp_path):
    t = tmp_path / "net.txt"
    t.write_text("# a tiny net\nconv: 64x3x7x7\n64\nfc.weight: 10, 64  # trailing comment\n")
    m = read_shapes(str(t))
    assert [p.shape for p in m.params] == [(64, 3, 7, 7), (64,), (10, 64)]
    assert m.params[0].name == "conv" and m.numel == 64 * 147 + 64 + 640
    j = tmp_path / "net.json"
    j.write_text('{"w": [3, 4], "b": [4]}')
    assert [(p.name, p.shape) for p in read_shapes(str(j)).params] == [("w", (3, 4)), ("b", (4,))]


@pytest.mark.parametrize("text,needle", [
    ("64xfoo\n", "is not a shape"), ("0x3\n", "zero dimension"), ("# nothing\n", "no shapes"),
    ('[[3, -1]]', "positive integers"), ('[[3, 4]', "not valid JSON"),
])
def test_bad_shapes_files(tmp_path, text, needle):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(UsageError, match=needle):
        read_shapes(str(f))


def test_unknown_model_names_the_choices():
    with pytest.raises(UsageError, match="resnet50"):
        model_shapes("resnet51")
