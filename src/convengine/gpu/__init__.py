"""GPU algorithms written in Triton (extra ``gpu``), behind the same API.

The fronts decide with :mod:`convengine.devices` (which imports neither torch nor
triton) and call this package's modules directly: :mod:`.dispatch` for the float
calls, :mod:`.quant` for ``qconv``, :mod:`.autograd` for ``convengine.torch``'s
device tensors. The graph front's device executor is :mod:`convengine.graph.gpu`.
"""
