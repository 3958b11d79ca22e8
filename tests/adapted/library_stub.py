"""A small library built on transformers.Trainer, written the way sentence-transformers, setfit and TRL are: a
decorated `__init__` and `compute_loss` (functools.wraps) that call `super()`, an abstract base, a class attribute
naming its arguments class, dataclass fields under `from __future__ import annotations`, a runner class that builds
the trainer, and a model whose `fit()` builds one."""

from __future__ import annotations

import abc
import dataclasses
import functools

import torch
import transformers


def renamed(**renames: str):
    """Rename keyword arguments before calling the method (sentence-transformers' `deprecated_kwargs`)."""

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return wrapper

    return decorator


@dataclasses.dataclass
class StubArguments(transformers.TrainingArguments):
    knob: int | None = dataclasses.field(default=3, metadata={"help": "A field of the library's own."})


class BaseStubTrainer(transformers.Trainer, abc.ABC):
    training_args_class = StubArguments

    @renamed(tokenizer="processing_class")
    def __init__(self, model=None, args=None, **kwargs):
        if args is None:
            args = self.training_args_class(output_dir="stub_trainer")
        elif not isinstance(args, self.training_args_class):
            raise ValueError(f"pass a {self.training_args_class.__qualname__}")
        super().__init__(model=model, args=args, **kwargs)

    @abc.abstractmethod
    def default_loss(self) -> str: ...


class StubTrainer(BaseStubTrainer):
    def default_loss(self) -> str:
        return "mse"

    @renamed()
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.__dict__["decorated_calls"] = self.__dict__.get("decorated_calls", 0) + 1
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class Runner:
    """Builds a trainer of the library (setfit's `Trainer` builds a sentence-transformers trainer so)."""

    def __init__(self, model, output_dir: str):
        self.trainer = StubTrainer(
            model=model, args=StubArguments(output_dir=output_dir, use_cpu=True, report_to="none", max_steps=2)
        )


class StubModel(torch.nn.Module):
    def fit(self, output_dir: str):
        return StubTrainer(model=self, args=StubArguments(output_dir=output_dir))
