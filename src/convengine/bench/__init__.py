"""Benchmarks, the model zoo and the demo: what the ``convengine`` command runs.

Kept out of the core import path: ``import convengine`` imports none of these; the
CLI loads them inside the subcommand that needs them.

- :mod:`convengine.bench.suites`: layer-shape suites of real networks.
- :mod:`convengine.bench.models`: ResNet-50 and MobileNetV2 in PyTorch (torch extra).
- :mod:`convengine.bench.modelbench`: whole networks side by side with PyTorch.
- :mod:`convengine.bench.peers`: whole networks against ONNX Runtime, OpenVINO, PyTorch
  eager and ``torch.compile``, each engine in a fresh process (``convengine bench --peers``).
- :mod:`convengine.bench.onnx_models`: the networks' ONNX exports and their int8
  quantizations (torch and onnx extras).
- :mod:`convengine.bench.demo`: ``convengine demo`` (demo extra).
"""
