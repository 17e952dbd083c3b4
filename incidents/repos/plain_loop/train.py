"""A plain DDP training loop: one model, one loader, metrics to a remote endpoint every step."""
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

try:
    from eroica.collector import Monitor
except ImportError:  # without eroica installed the job trains unmonitored (tests stand in for it)
    Monitor = None


def build_loader(n: int = 256) -> DataLoader:
    data = TensorDataset(torch.randn(n, 32), torch.randn(n, 1))
    return DataLoader(
        data,
        batch_size=16,
        shuffle=True,  # a fresh order every epoch
        drop_last=True,
    )


def log_metrics(step: int, loss: float) -> None:
    time.sleep(0.01)  # stands in for an HTTP post to the metrics service
    print(f"step {step} loss {loss:.4f}")


def save_checkpoint(model: torch.nn.Module, step: int) -> None:
    torch.save(model.state_dict(), os.path.join("checkpoints", f"step{step}.pt"))


def main(epochs: int = 1) -> None:
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor("runs/plain")
    step = 0
    for _ in range(epochs):
        for x, y in mon.wrap_loader(build_loader()):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with mon.region("log_metrics"):
                log_metrics(step, loss.item())
            if step % 100 == 0:
                with mon.region("save_checkpoint"):
                    save_checkpoint(model, step)
            mon.step()
            step += 1
    mon.close()


if __name__ == "__main__":
    main()
