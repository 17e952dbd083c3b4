import module


def test_the_datamodule_gives_loaders():
    d = module.Data(16)
    d.setup()
    assert d.val_dataloader().num_workers == 0
    assert len(d.train_dataloader()) == 32


def test_the_training_loader_gives_batches_the_module_trains_on():
    d = module.Data(16)
    d.setup()
    x, y = next(iter(d.train_dataloader()))
    loss = module.Regressor().training_step((x, y), 0)
    assert x.shape == (16, 16) and loss.ndim == 0
