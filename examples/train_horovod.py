"""A Horovod-style training script on gradwire: only the import line differs from Horovod's.

    gradwire-run -np 4 -- python3 examples/train_horovod.py --epochs 2
    GW_FUSION_THRESHOLD=0 gradwire-run -np 2 -- python3 examples/train_horovod.py --fp16-allreduce

A small convolutional net with SyncBatchNorm learns a synthetic 10-class problem (no download).
Prints the loss and accuracy averaged over the ranks per epoch, and images/sec.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradwire.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="Horovod-style synthetic training on gradwire")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batches-per-epoch", type=int, default=20)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--codec", default="", help="a gradwire codec spec, e.g. topk:0.1")
parser.add_argument("--backward-passes-per-step", type=int, default=1)
parser.add_argument("--min-accuracy", type=float, default=0.0,
                    help="exit 1 unless the last epoch's accuracy reaches this")
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())  # Horovod: pin the GPU to the local rank
device = "cuda" if torch.cuda.is_available() else "cpu"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = hvd.SyncBatchNorm(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


# Synthetic data: each class is a fixed random pattern plus noise; every rank draws its own
# shard (Horovod's examples use a DistributedSampler over a real dataset).
patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(0))
gen = torch.Generator().manual_seed(1000 + hvd.rank())


def batch() -> tuple:
    y = torch.randint(0, 10, (args.batch_size,), generator=gen)
    x = patterns[y] + 0.8 * torch.randn(args.batch_size, 1, 28, 28, generator=gen)
    return x.to(device), y.to(device)


model = Net().to(device)
# Horovod: scale the learning rate by the number of ranks.
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
if args.codec:
    compression = hvd.Compression.codec(args.codec)
# Horovod: broadcast the initial parameters and optimizer state from rank 0.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
# Horovod: wrap the optimizer; gradients are averaged as backward produces them.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression, op=hvd.Average,
                                     backward_passes_per_step=args.backward_passes_per_step)


def metric_average(val: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(val), name=name).item()


acc = 0.0
for epoch in range(args.epochs):
    model.train()
    start = time.time()
    total_loss = correct = seen = 0.0
    for i in range(args.batches_per_epoch):
        optimizer.zero_grad()
        for _ in range(args.backward_passes_per_step):
            x, y = batch()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            total_loss += loss.item()
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
        optimizer.step()
    took = time.time() - start
    loss = metric_average(total_loss / (args.batches_per_epoch * args.backward_passes_per_step),
                          "avg_loss")
    acc = metric_average(correct / seen, "avg_accuracy")
    if hvd.rank() == 0:
        print(f"epoch {epoch}: loss {loss:.4f} accuracy {acc:.3f} "
              f"{seen * hvd.size() / took:.0f} images/sec on {hvd.size()} ranks", flush=True)

if acc < args.min_accuracy:
    raise SystemExit(f"rank {hvd.rank()}: accuracy {acc:.3f} below {args.min_accuracy}")
