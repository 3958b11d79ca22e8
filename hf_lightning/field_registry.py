"""`python -m hf_lightning.field_registry` prints the README's table of arguments (a documented command).

The table of handlers it prints from lives in `hf_lightning/translation/handler_table.py`.
"""

from hf_lightning.translation.handler_table import registry_markdown

if __name__ == "__main__":
    print(registry_markdown(), end="")
