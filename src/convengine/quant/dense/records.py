"""The argument records of the int8 micro-kernels (:mod:`.vnni`, :mod:`.avx2`).

A micro-kernel takes a few records, each a numba tuple whose members are named by a
``NamedTuple`` class (the A operand ``(a, a_off, lda, mr)``, the requantization, ...).
A layout, an instance of that class holding numba types, says what each member is:
:data:`ARRAY` (an array, kept as typed) or the scalar type it is cast to.
:func:`record_type` gives the tuple type of a record argument in the kernel's
signature; :func:`unpack` gives, in codegen, the record's IR values by name (arrays
as pointers to their first element). The tuples are SSA values: the kernel's code is
emitted at its call, LLVM takes them apart, and the tile's code is that of separate
arguments.

A tuple holding arrays holds a reference to each (numba increments their counts when
it builds the tuple, and decrements them when the tuple dies): these atomic updates
cancel out of the compiled code only where nothing else releases a reference in
between. So a caller builds each record in the loop body that calls the kernel, right
at the call, not once before the loop, and no branch chooses between records holding
different arrays (one loop per branch instead). The drivers of :mod:`.kernels` do so:
their compiled code updates no more counts than with the arrays passed alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError

#: a layout's member that is an array, of any type
ARRAY = None

R = TypeVar("R", bound=NamedTuple)


def record_type(ty: Any, layout: NamedTuple) -> types.Tuple:
    """The type a kernel's signature gives the record argument typed ``ty``: a tuple of
    ``layout``'s length whose :data:`ARRAY` members are arrays (kept) and whose other
    members take ``layout``'s types (the call casts them)."""
    name, fields = type(layout).__name__, layout._fields
    if not isinstance(ty, (types.Tuple, types.UniTuple)) or len(ty) != len(fields):
        raise TypingError(f"{name}: a tuple ({', '.join(fields)}) expected, got {ty}")
    members = []
    for field, want, got in zip(fields, layout, ty.types):
        if want is ARRAY and not isinstance(got, types.Array):
            raise TypingError(f"{name}.{field}: an array expected, got {got}")
        members.append(got if want is ARRAY else want)
    return types.Tuple(members)


def unpack(context: Any, builder: ir.IRBuilder, ty: types.Tuple, value: ir.Value,
           record: type[R]) -> R:
    """The members of the record ``value`` (typed ``ty``, from :func:`record_type`) as
    ``record`` of IR values: arrays as their data pointers, scalars as they are."""
    members = []
    for t, v in zip(ty.types, cgutils.unpack_tuple(builder, value, len(ty))):
        members.append(context.make_array(t)(context, builder, v).data
                       if isinstance(t, types.Array) else v)
    return record(*members)


def unpack_args(context: Any, builder: ir.IRBuilder, signature: Any, args: Any,
                *records: type[NamedTuple]) -> list[Any]:
    """:func:`unpack` of each of a kernel's arguments, ``records`` their classes in
    order."""
    return [unpack(context, builder, ty, value, record)
            for ty, value, record in zip(signature.args, args, records, strict=True)]
