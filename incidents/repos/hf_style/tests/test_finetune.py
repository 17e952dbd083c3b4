import torch

import finetune


class Tiny(torch.nn.Module):
    """A token model small enough for a test: embeddings, mean-pooled, one output."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, input_ids, labels=None):
        out = self.head(self.emb(input_ids).mean(dim=1))
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def tokens(n: int = 32) -> list[dict[str, torch.Tensor]]:
    """Tokenized rows, as a fine-tuning data set holds them."""
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 64, (12,), generator=g), "labels": torch.randn(1, generator=g)}
            for _ in range(n)]


def test_a_short_finetune_runs(tmp_path):
    model = Tiny()
    before = model.head.weight.detach().clone()
    finetune.finetune(model, tokens(), str(tmp_path))
    assert not torch.equal(before, model.head.weight.detach())
