"""Benchmarks, the model zoo and the demo: what the ``convengine`` command runs.

Kept out of the core import path: ``import convengine`` imports none of these; the
CLI loads them inside the subcommand that needs them.

- :mod:`convengine.bench.suites`: layer-shape suites of real networks.
- :mod:`convengine.bench.models`: ResNet-50 and MobileNetV2 in PyTorch (torch extra).
- :mod:`convengine.bench.modelbench`: whole networks side by side with PyTorch.
- :mod:`convengine.bench.demo`: ``convengine demo`` (demo extra).
"""
