import train


def test_a_short_run():
    assert train.train(max_steps=3) == 3


def test_the_ranks_together_see_every_record_once():
    seen = [len(x[0]) for r in range(4) for x in train.make_loader(r, 4)]
    assert len(seen) == 400 and seen.count(64) == 100
