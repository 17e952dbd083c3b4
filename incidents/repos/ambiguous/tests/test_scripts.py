from scripts import finetune, pretrain


def test_both_scripts_run():
    pretrain.run()
    finetune.run()
