import train


def test_a_short_run():
    assert train.train(max_steps=3) == 3
    assert len(train.make_loader(0, 2)) == 150
