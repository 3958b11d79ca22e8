"""`python -m hf_lightning.field_registry` prints the README's table of arguments (a documented command).

The registry itself lives in `hf_lightning/translation/field_registry.py`.
"""

from hf_lightning.translation.field_registry import registry_markdown

if __name__ == "__main__":
    print(registry_markdown(), end="")
