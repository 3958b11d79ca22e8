"""The bottom layer: what every other subpackage may import and nothing here imports from them.

The facade protocols, the outputs of train / evaluate / predict, device helpers, seeding, the reference's enums,
the forward autocast and the checkpoint file names with their pickle-free reading.
"""
