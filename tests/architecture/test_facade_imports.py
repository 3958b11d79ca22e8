"""No component imports the facade's module: only the facade's room (hf_lightning/trainer/, where the Seq2Seq facade
subclasses it) and what stands above it do (the package's public face, the adapter that rebuilds a library's
Trainer subclass on it, the CLI that builds it). A component that needs a trainer member receives it; it never
reaches up for the class."""

from __future__ import annotations

from tests.architecture.test_import_cycles import import_graph

FACADE_MODULE = "hf_lightning.trainer.trainer"
FACADE_ROOM = "hf_lightning.trainer."  # the facade's room: the facade, its Seq2Seq subclass, its mixins
ABOVE_THE_FACADE = {
    "hf_lightning",  # the public face (`from hf_lightning import Trainer`)
    "hf_lightning.adapted.registry",  # `on_lightning`: a library's Trainer subclass rebuilt on the facade
    "hf_lightning.cli.lightning_cli",  # the CLI builds the trainer from a config
}


def allowed(module: str) -> bool:
    return module.startswith(FACADE_ROOM) or module in ABOVE_THE_FACADE


def test_no_component_module_imports_the_facade_module():
    importers = {module for module, imported in import_graph().items() if FACADE_MODULE in imported}
    assert {module for module in importers if not allowed(module)} == set(), (
        "components importing the facade's module (pass them what they need instead):\n"
        + "\n".join(sorted(module for module in importers if not allowed(module)))
    )
    assert importers, "the import graph no longer sees the facade's importers: the test would pass vacuously"
