"""The facade's Hugging Face Hub methods: `init_hf_repo`, `push_to_hub` and the push after each save.

As the reference's trainer: the repo is created (`exist_ok=True`) in the constructor; each save copies the model
files of the new checkpoint into `output_dir` and starts a background `upload_folder` of `output_dir` ("Training
in progress, step N"), plus one of the checkpoint into `last-checkpoint/` (or `checkpoint-N/`) for those
`hub_strategy` values; a push is skipped while the previous one runs unless `hub_always_push`; `train()` waits
for running pushes and `push_to_hub()` makes the final commit. Ours on top: the token is checked with `whoami`
before the repo is created (a wrong or missing token fails in the constructor with a message that says so), the
scratch folders of our atomic saves and our checkpoint marker are never uploaded (integrations/hub.py),
`training_args.bin` holds no token, and a failed background push is reported (the reference drops its error).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from hf_lightning.checkpoint.staging import training_args_to_plain_dict
from hf_lightning.core.checkpoint_files import TRAINING_ARGS_NAME
from hf_lightning.core.enums import enum_value
from hf_lightning.core.version import __version__
from hf_lightning.integrations.hub import PushInProgress, modeling_files, push_ignore_patterns, token_error

logger = logging.getLogger(__name__)

__all__ = ["HubMixin"]


class HubMixin:
    """The Hub methods of the trainer facade (pushes from world process zero only; other ranks never connect).

    Needs `self.args`, `self.model`, `self.state`, `self.control`, `self.callback_handler`, `self.processing_class`,
    `save_model`, `create_model_card` and `is_world_process_zero()`.
    """

    # The background pushes of the last save (set once a push starts; `init_hf_repo` resets it), as the reference's.
    push_in_progress: PushInProgress | None = None

    def _hub_client(self) -> Any:
        """This trainer's `HfApi` (its background pushes run one after another on its own worker thread)."""
        api = self.__dict__.get("_hub_api")
        if api is None:
            from huggingface_hub import HfApi

            api = HfApi(library_name="hf_lightning", library_version=__version__)
            self._hub_api = api
        return api

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create (or reuse) the repo `plan.hub.model_id` (default: the name of `output_dir`), process zero only.

        The token (`token`, else `args.hub_token`, else HF_TOKEN or the cached login) is checked with `whoami` first.
        """
        if not self.is_world_process_zero():
            return
        from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

        repo_name = self.plan.hub.model_id
        if repo_name is None:
            repo_name = Path(self.args.output_dir).absolute().name
        token = token if token is not None else self.args.hub_token
        private = private if private is not None else self.plan.hub.private_repo
        api = self._hub_client()
        try:
            api.whoami(token=token)
        except LocalTokenNotFoundError:
            raise ValueError(
                "push_to_hub=True needs a Hub token: set `hub_token`, the HF_TOKEN environment variable, or log in "
                "with `hf auth login`; or set push_to_hub=False."
            ) from None
        except HfHubHTTPError as error:
            raise token_error(api.endpoint, error) from None
        repo_url = api.create_repo(repo_name, token=token, private=private, exist_ok=True)
        self.hub_model_id = repo_url.repo_id
        self.push_in_progress = None

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Save the model, write the model card, and upload `output_dir` (kwargs go to `create_model_card`).

        Returns huggingface_hub's `CommitInfo`, or a `Future` of it when `blocking=False`; None on other processes.
        """
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        model_name = kwargs.pop("model_name", None)
        if model_name is None and self.args.should_save:
            if self.plan.hub.model_id is None:
                model_name = Path(self.args.output_dir).name
            else:
                model_name = self.plan.hub.model_id.split("/")[-1]
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)  # every process (sharded saves gather)
        if not self.is_world_process_zero():
            return None
        model_tags = getattr(self.model, "model_tags", None)
        if model_tags is not None:
            tags = kwargs.get("tags", [])
            tags = [tags] if isinstance(tags, str) else list(tags)
            kwargs["tags"] = tags + [tag for tag in model_tags if tag not in tags]
        self.create_model_card(model_name=model_name, **kwargs)
        if revision is None:
            revision = self.plan.hub.revision
        self._finish_current_push()
        return self._hub_client().upload_folder(
            repo_id=self.hub_model_id,
            folder_path=self.args.output_dir,
            commit_message=commit_message,
            token=token,
            run_as_future=not blocking,
            ignore_patterns=push_ignore_patterns(checkpoint=False),
            revision=revision,
        )

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """After a save: the model files into `output_dir`, then the background push(es) `hub_strategy` asks for."""
        strategy = enum_value(self.plan.hub.strategy)
        if not self.is_world_process_zero() or strategy == "end":
            return
        in_progress = self.push_in_progress
        if not self.plan.hub.always_push and in_progress is not None and not in_progress.is_done():
            return
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        output_dir = self.args.output_dir
        for name in modeling_files(checkpoint_folder):
            source = os.path.join(checkpoint_folder, name)
            if os.path.isfile(source):
                shutil.copy(source, os.path.join(output_dir, name))
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        import torch

        torch.save(training_args_to_plain_dict(self.args), os.path.join(output_dir, TRAINING_ARGS_NAME))

        if enum_value(self.plan.checkpointing.save_strategy) == "steps":
            commit_message = f"Training in progress, step {self.state.global_step}"
        else:
            commit_message = f"Training in progress, epoch {int(self.state.epoch)}"
        api = self._hub_client()
        jobs = [
            api.upload_folder(
                repo_id=self.hub_model_id,
                folder_path=output_dir,
                commit_message=commit_message,
                token=self.args.hub_token,
                run_as_future=True,
                ignore_patterns=push_ignore_patterns(checkpoint=False),
                revision=self.plan.hub.revision,
            )
        ]
        if strategy in ("checkpoint", "all_checkpoints"):
            path_in_repo = "last-checkpoint" if strategy == "checkpoint" else Path(checkpoint_folder).name
            jobs.append(
                api.upload_folder(
                    repo_id=self.hub_model_id,
                    folder_path=checkpoint_folder,
                    path_in_repo=path_in_repo,
                    commit_message=commit_message + ", checkpoint",
                    token=self.args.hub_token,
                    run_as_future=True,
                    ignore_patterns=push_ignore_patterns(checkpoint=True),
                    revision=self.plan.hub.revision,
                )
            )
        if in_progress is None or in_progress.is_done():
            self.push_in_progress = PushInProgress(jobs)
        else:
            in_progress.jobs.extend(jobs)

    def _finish_current_push(self) -> None:
        """Wait for the running background pushes; a failed one is reported as a warning."""
        in_progress = self.push_in_progress
        if in_progress is None:
            return
        if not in_progress.is_done():
            logger.info("Waiting for the current checkpoint push to be finished, this might take a couple of minutes.")
            in_progress.wait_until_done()
        for job in in_progress.jobs:
            error = None if job.cancelled() else job.exception()
            if error is not None:
                logger.warning(f"A background push to the Hub failed: {type(error).__name__}: {error}")
        in_progress.jobs = []  # all finished and reported
