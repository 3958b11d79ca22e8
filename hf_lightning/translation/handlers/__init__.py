"""The arguments' translation handlers, grouped by theme (see `hf_lightning.translation.handler_table`)."""
