import module


def test_the_datamodule_gives_loaders():
    d = module.Data(16)
    d.setup()
    assert d.val_dataloader().num_workers == 0
    assert len(d.train_dataloader()) == 32
