"""A LightningDataModule and LightningModule; Lightning's Trainer owns the loop."""
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        self.train_set = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
        self.val_set = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        # deterministic eval: single process, fixed order
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=0)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 1)

    def training_step(self, batch, _idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)
