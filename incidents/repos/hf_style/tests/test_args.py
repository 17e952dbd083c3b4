import finetune


def test_the_arguments_build(tmp_path):
    args = finetune.training_args(str(tmp_path))
    assert args.per_device_train_batch_size == 8
