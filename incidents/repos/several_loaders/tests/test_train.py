import train


def test_an_epoch_on_the_training_loader_then_evaluation():
    accuracy = train.run(rank=0, world=2, epochs=1)
    assert 0.0 <= accuracy <= 4.0            # four evaluation batches, each a mean in [0, 1]
