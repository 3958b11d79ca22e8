"""The telemetry: where a run's time goes (throughput, FLOPs and MFU, the time shares, peak memory).

`settings.py` (the user's options), `callback.py` (`Telemetry`, those options as a Lightning callback), `meter.py`
(`TelemetryMeter`, the trainer's component), `clocks.py` / `counting.py` (what a step records without waiting for
the device), `flops.py` (Lightning's FLOP counter and peak FLOP/s), `figures.py` (the arithmetic and the summary).
No export here: `import hf_lightning.engine.telemetry.settings` must not load Lightning.
"""
