import train


def test_the_config_builds_a_loader_and_a_model():
    cfg = train.load_config()
    loader, model = train.build(cfg)
    assert loader.batch_size == cfg["data"]["batch_size"]
    assert isinstance(cfg["debug"]["detect_anomaly"], bool)


def test_the_loop_trains_from_the_config():
    assert train.main(max_steps=3) == 3
