"""Worker: Hugging Face's front doors on a process group initialised before them, as
docs/clients.md shows: accelerate's Accelerator (a DDP model, three steps) and transformers'
Trainer (a tiny BERT built from a config, three steps). argv: the backend to initialise
(wirespeed, or gloo as the control). Reports what each library says its backend is and the
trained parameters."""
import datetime
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
backend = sys.argv[1]
dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
out = {"process_group": dist.get_backend()}


def flat(model) -> list[float]:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]).tolist()


def with_accelerate():
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    gen = torch.Generator().manual_seed(50 + rank)
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    return {"reported_backend": str(acc.state.backend), "distributed_type": str(acc.distributed_type),
            "num_processes": acc.num_processes, "params": flat(acc.unwrap_model(model))}


def with_trainer():
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=2)
    model = BertForSequenceClassification(cfg)
    gen = torch.Generator().manual_seed(7)
    data = [{"input_ids": torch.randint(0, 40, (8,), generator=gen), "attention_mask": torch.ones(8, dtype=torch.long),
             "labels": int(torch.randint(0, 2, (1,), generator=gen))} for _ in range(24)]
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, use_cpu=True, per_device_train_batch_size=2, max_steps=3,
                                 learning_rate=1e-2, report_to=[], save_strategy="no", logging_strategy="no",
                                 seed=0, data_seed=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        result = trainer.train()
    return {"world_size": args.world_size, "loss": result.training_loss, "params": flat(model)}


for name, fn in (("accelerate", with_accelerate), ("trainer", with_trainer)):
    try:
        out[name] = fn()
    except ImportError as e:
        out[name] = {"missing": str(e)}
    except Exception as e:  # noqa: BLE001 - reported; the test says what failed
        out[name] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
report(out)
dist.destroy_process_group()
os._exit(0)
