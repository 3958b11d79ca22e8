"""hf-lightning is on no package registry: no message or document may advertise installing it by name with an
extra; an extra is installed from the checkout, `pip install -e ".[extra]"`."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Built from parts so this file does not match itself.
REGISTRY_FORM = re.compile("hf" + r"[-_]lightning\s*\[")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    suffixes = {".py", ".md", ".ipynb", ".toml", ".yaml", ".yml", ".txt", ".cfg"}
    return [REPO / name for name in listed.splitlines() if Path(name).suffix in suffixes and (REPO / name).is_file()]


def test_no_message_or_document_advertises_the_registry_install():
    offenders = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _tracked_text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if REGISTRY_FORM.search(line)
    ]
    assert not offenders, "install extras from the checkout (pip install -e \".[extra]\"):\n" + "\n".join(offenders)


def test_extra_hints_name_the_checkout_install():
    from hf_lightning.integrations.hp_search import resolve_backend

    try:
        resolve_backend("wandb")
    except ValueError as error:
        assert 'pip install -e ".[optuna]"' in str(error) and "from a checkout" in str(error), error
        assert 'pip install -e ".[ray]"' in str(error), error
    else:
        raise AssertionError("backend='wandb' was accepted")
