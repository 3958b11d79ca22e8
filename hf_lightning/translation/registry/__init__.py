"""Field handlers of the argument registry, grouped by theme (see `hf_lightning.translation.field_registry`)."""
