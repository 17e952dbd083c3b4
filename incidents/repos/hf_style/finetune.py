"""Fine-tuning with the Hugging Face Trainer: the Trainer builds the loaders and runs the loop."""
from transformers import Trainer, TrainingArguments


def training_args(output_dir: str = "out") -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        learning_rate=5e-5,
        num_train_epochs=1,
        logging_steps=50,  # the loss curve, not every step
        report_to=[],
    )


def finetune(model, dataset, output_dir: str = "out") -> None:
    Trainer(model=model, args=training_args(output_dir), train_dataset=dataset).train()
