"""One training step, written the way a debugging session left it."""
import torch


def train_step(model, batch, opt, scaler=None):
    x, y = batch
    # NaNs appeared at step ~40k; trace where they start
    with torch.autograd.detect_anomaly():
        out = model(x)
        loss = torch.nn.functional.mse_loss(
            out,  # predictions
            y,    # targets
            reduction="mean",
        )
        loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()
