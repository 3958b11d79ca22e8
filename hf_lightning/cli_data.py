"""The import path that Lightning CLI configs name in `data: class_path: hf_lightning.cli_data.*`.

The data sources live in `hf_lightning/cli/data_sources.py`; YAML files written for earlier versions keep
working through these names.
"""

from hf_lightning.cli.data_sources import *  # noqa: F403  (every public name)
