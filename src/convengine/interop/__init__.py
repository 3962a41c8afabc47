"""Interop helpers that need no optional dependency (the torch and onnx layers live in
:mod:`convengine.torch` and :mod:`convengine.onnx`)."""
