"""No component imports the facade's module: only what stands at the facade's level does (the package's public face,
the Seq2Seq facade that subclasses it, the adapter that rebuilds a library's Trainer subclass on it, the CLI that
builds it). A component that needs a trainer member receives it; it never reaches up for the class."""

from __future__ import annotations

from tests.architecture.test_import_cycles import import_graph

FACADE_MODULE = "hf_lightning.trainer.trainer"
FACADE_LEVEL = {
    "hf_lightning",  # the public face (`from hf_lightning import Trainer`)
    "hf_lightning.trainer.seq2seq",  # Seq2SeqTrainer: the facade's subclass
    "hf_lightning.adapted.registry",  # `on_lightning`: a library's Trainer subclass rebuilt on the facade
    "hf_lightning.cli.lightning_cli",  # the CLI builds the trainer from a config
}


def test_no_component_module_imports_the_facade_module():
    importers = {module for module, imported in import_graph().items() if FACADE_MODULE in imported}
    assert importers - FACADE_LEVEL == set(), (
        "components importing the facade's module (pass them what they need instead):\n"
        + "\n".join(sorted(importers - FACADE_LEVEL))
    )
    assert importers, "the import graph no longer sees the facade's importers: the test would pass vacuously"
