import data


def test_three_loaders_and_eval_stays_in_process():
    train, evaluation, calibration = data.loaders(0, 2)
    assert evaluation.num_workers == 0
    assert len(list(calibration)) == 16


def test_the_training_loader_gives_this_ranks_shard():
    train, _, _ = data.loaders(1, 2)
    batches = list(train)
    assert sum(len(x) for x, _ in batches) == 256 and batches[0][0].shape[1] == 8
