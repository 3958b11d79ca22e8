"""Every rule ID cited in the repository resolves to an entry of docs/reference-behaviour.md.

Comments, docstrings and tests cite the reference's behaviour by ID (`R4.5`, `V12`, `EVAL-2.9`, ...). The
scan below fails, naming file:line, for an ID the page does not define and for wording that points at
documents outside the repository; a second test checks that the page's reference locations exist.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference-behaviour.md"
SCANNED = ["hf_lightning", "tests", "benchmarks", "examples", "docs", "notebooks", "README.md"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".ipynb", ".cfg"}
SKIPPED = {PAGE, Path(__file__).resolve()}

# A rule ID: a prefixed section ID (EVAL-2.9) or a letter and numbers (R4.5, V12, T9).
ID = re.compile(r"\b(?:(?:API|EVAL|CKPT|CB|HPO|S2S|METRICS)-\d+(?:\.\d+)*|[RTVEQSAD]\d+(?:\.\d+)*)\b")
# Lint codes after `noqa:` (E402, A002, ...) are not rule IDs.
NOQA = re.compile(r"noqa:?[A-Z0-9, ]*")
# Tokens shaped like an ID that are ordinary names: hardware, and a fixture named after R2.10.
ALLOWED = {
    "A100": "a GPU model",
    "H100": "a GPU model",
    "H200": "a GPU model",
    "V100": "a GPU model",
    "R210": "the argument set of tests/parity/test_resume.py's R2.10 data-order test",
}
# Wording that points at documents outside the repository instead of at an ID.
OUTSIDE = re.compile(
    r"\bspec(?:'s)?\s+(?:part|section|fixture|table|check|[RTV]?\d)|trainer-semantics|decisions\.md|/work/shared",
    re.IGNORECASE,
)
PAGE_ROW = re.compile(r"^\| ([A-Z0-9.-]+) \| (.+?) \| (.+?) \|$")


def page_rows() -> dict[str, tuple[str, str]]:
    """ID -> (behaviour, reference) for every table row of the page."""
    rows: dict[str, tuple[str, str]] = {}
    for line in PAGE.read_text().splitlines():
        match = PAGE_ROW.match(line)
        if match and match.group(1) != "ID":
            assert match.group(1) not in rows, f"{match.group(1)} is defined twice on {PAGE.name}"
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


def scanned_files() -> list[Path]:
    """The repository's text files under the scanned folders, the page and this test excluded."""
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files += [
            p for p in candidates
            if p.is_file() and p.suffix in SUFFIXES and p.resolve() not in SKIPPED and "__pycache__" not in p.parts
        ]
    return files


def citations() -> tuple[list[tuple[str, str]], list[str]]:
    """(file:line, ID) for every cited ID, and file:line for every line that points outside the repository."""
    cited: list[tuple[str, str]] = []
    outside: list[str] = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            where = f"{path.relative_to(ROOT)}:{number}"
            cited += [(where, token) for token in ID.findall(NOQA.sub("", line)) if token not in ALLOWED]
            if OUTSIDE.search(line):
                outside.append(f"{where}: {line.strip()}")
    return cited, outside


def test_every_cited_id_is_defined_on_the_page():
    defined = page_rows()
    cited, _ = citations()
    # The scan must really see the citations the code keeps, so it cannot pass by scanning nothing.
    assert len(cited) > 100 and {"R4.5", "V12", "T9", "EVAL-2.9"} <= {token for _, token in cited}
    undefined = [f"{where}: {token}" for where, token in cited if token not in defined]
    assert not undefined, "IDs missing from docs/reference-behaviour.md:\n" + "\n".join(undefined)


def test_no_comment_points_outside_the_repository():
    _, outside = citations()
    assert not outside, "cite an ID of docs/reference-behaviour.md instead:\n" + "\n".join(outside)


def test_the_scan_recognises_ids_and_ignores_lint_codes():
    line = "x = 1  # noqa: E402 - R4.5 and EVAL-2.9, not S2S or V100 (CKPT-3.13 to CKPT-3.15)"
    tokens = [t for t in ID.findall(NOQA.sub("", line)) if t not in ALLOWED]
    assert tokens == ["R4.5", "EVAL-2.9", "CKPT-3.13", "CKPT-3.15"]
    assert OUTSIDE.search("as in (spec part 2, 2.17)") and OUTSIDE.search("Spec R5.4: the lambdas")
    assert not OUTSIDE.search("importlib.util.find_spec(name)")


def _reference_root(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is needed to check the page's references"
    return Path(spec.origin).parent


def test_the_page_names_files_and_functions_of_the_installed_reference():
    roots = {name: _reference_root(name).parent for name in ("transformers", "accelerate")}
    rows = page_rows()
    assert len(rows) > 100
    missing: list[str] = []
    for rule, (behaviour, reference) in rows.items():
        assert behaviour.strip() and reference.strip(), rule
        for segment in reference.split(";"):
            names = re.findall(r"`([^`]+)`", segment)
            if not names:
                assert "no counterpart" in segment, f"{rule}: no reference location in {segment!r}"
                continue
            path, functions = names[0], names[1:]
            source = roots[path.split("/")[0]] / path
            if not source.is_file():
                missing.append(f"{rule}: {path}")
                continue
            text = source.read_text()
            for dotted in functions:
                for part in dotted.split("."):
                    if not re.search(rf"^\s*(?:def|class) {re.escape(part)}\b|^{re.escape(part)} = ", text, re.M):
                        missing.append(f"{rule}: {path} has no {part} ({dotted})")
    assert not missing, "\n".join(missing)
