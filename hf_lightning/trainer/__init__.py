"""The facade's room: `HFLightningTrainer`, `HFLightningSeq2SeqTrainer` and every class they are built from.

The reference-named methods (the override points) live here; the components they call live in the layers below
and receive what they need, never the facade.
"""
