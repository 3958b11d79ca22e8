"""Writes notebooks/quickstart.ipynb (no outputs). Run from the repository root."""
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = [
    new_markdown_cell(
        "# hf_lightning quickstart\n"
        "\n"
        "A Hugging Face `Trainer` script runs on PyTorch Lightning's engine by changing one import. This notebook "
        "trains a tiny transformer on hf_lightning's built-in task (sentences sorted into four topics, generated "
        "in-process: nothing is downloaded, transformers is not needed), then evaluates, predicts, plots the "
        "training curves and resumes from a checkpoint. It runs in well under a minute on a laptop CPU."
    ),
    new_markdown_cell("## 1. The import swap"),
    new_code_cell(
        "# Before: from transformers import Trainer, TrainingArguments\n"
        "from hf_lightning import Trainer, TrainingArguments"
    ),
    new_markdown_cell(
        "## 2. Data, tokenizer and model\n"
        "\n"
        "`build_embedded_run` builds the task's datasets, word-level tokenizer, a 2-layer transformer classifier "
        "(a plain `nn.Module` returning `{\"loss\", \"logits\"}`, like a Hugging Face model), its collator and an "
        "accuracy metric. Any model and dataset a `transformers.Trainer` accepts work the same way."
    ),
    new_code_cell(
        "import torch\n"
        "\n"
        "from hf_lightning.cli.embedded import TOPICS, build_embedded_run\n"
        "\n"
        "torch.set_num_threads(1)  # a tiny model: one thread is the fastest on a busy CPU\n"
        "OUTPUT_DIR = \"quickstart_output\"\n"
        "\n"
        "\n"
        "def make_trainer():\n"
        "    run = build_embedded_run(OUTPUT_DIR, seed=42, train_size=1600, eval_size=128)\n"
        "    args = TrainingArguments(\n"
        "        output_dir=OUTPUT_DIR,\n"
        "        num_train_epochs=3,\n"
        "        per_device_train_batch_size=32,\n"
        "        per_device_eval_batch_size=64,\n"
        "        learning_rate=2e-3,\n"
        "        warmup_steps=0.1,  # below 1: a ratio of the total steps\n"
        "        logging_steps=10,\n"
        "        eval_strategy=\"epoch\",\n"
        "        save_strategy=\"epoch\",\n"
        "        report_to=\"none\",\n"
        "        use_cpu=True,\n"
        "        seed=42,\n"
        "    )\n"
        "    trainer = Trainer(\n"
        "        model=run[\"model\"],\n"
        "        args=args,\n"
        "        data_collator=run[\"data_collator\"],\n"
        "        train_dataset=run[\"train_dataset\"],\n"
        "        eval_dataset=run[\"eval_dataset\"],\n"
        "        processing_class=run[\"tokenizer\"],\n"
        "        compute_metrics=run[\"compute_metrics\"],\n"
        "    )\n"
        "    return trainer, run\n"
        "\n"
        "\n"
        "trainer, run = make_trainer()\n"
        "print(f\"{len(run['train_dataset'])} training sentences, {len(run['eval_dataset'])} held out, topics: {TOPICS}\")"
    ),
    new_markdown_cell(
        "## 3. Train\n"
        "\n"
        "In Jupyter the progress bar is the reference's HTML one, with a row of metrics per evaluation."
    ),
    new_code_cell("train_output = trainer.train()\ntrain_output"),
    new_markdown_cell("## 4. Evaluate"),
    new_code_cell("metrics = trainer.evaluate()\nmetrics"),
    new_markdown_cell("## 5. Predict"),
    new_code_cell(
        "prediction = trainer.predict(run[\"eval_dataset\"])\n"
        "predicted = prediction.predictions.argmax(-1)\n"
        "for text, guess, label in list(zip(run[\"eval_dataset\"].texts, predicted, prediction.label_ids))[:5]:\n"
        "    print(f\"{TOPICS[guess]:>10} (true: {TOPICS[label]:>10})  {text}\")\n"
        "prediction.metrics"
    ),
    new_markdown_cell(
        "## 6. Training curves\n"
        "\n"
        "`trainer.state.log_history` holds every logged entry; `plot_log_history` draws the losses, the "
        "evaluation metrics and the learning rate against the step (`pip install -e \".[plot]\"` from the checkout)."
    ),
    new_code_cell(
        "%matplotlib inline\n"
        "from hf_lightning import plot_log_history\n"
        "\n"
        "plot_log_history(trainer.state.log_history)"
    ),
    new_markdown_cell(
        "## 7. Resume from a checkpoint\n"
        "\n"
        "`save_strategy=\"epoch\"` wrote a checkpoint after each epoch. A fresh trainer resumed from the first "
        "one continues at its step, with the saved weights, optimizer, scheduler and RNG states, and ends "
        "where the uninterrupted run ended."
    ),
    new_code_cell(
        "import os\n"
        "\n"
        "checkpoints = sorted(\n"
        "    (name for name in os.listdir(OUTPUT_DIR) if name.startswith(\"checkpoint-\")),\n"
        "    key=lambda name: int(name.split(\"-\")[1]),\n"
        ")\n"
        "print(checkpoints)\n"
        "resumed, _ = make_trainer()\n"
        "resumed_output = resumed.train(resume_from_checkpoint=os.path.join(OUTPUT_DIR, checkpoints[0]))\n"
        "print(\"resumed run:\", resumed_output.global_step, \"steps; uninterrupted run:\", train_output.global_step)\n"
        "resumed_metrics = resumed.evaluate()\n"
        "print(\"eval_loss after resuming:\", resumed_metrics[\"eval_loss\"], \"uninterrupted:\", metrics[\"eval_loss\"])"
    ),
]
notebook = new_notebook(
    cells=cells,
    metadata={
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    },
)
for index, cell in enumerate(notebook.cells):
    cell.id = f"quickstart-{index:02d}"  # stable ids: regenerating gives the same file
nbformat.validate(notebook)
nbformat.write(notebook, "notebooks/quickstart.ipynb")
