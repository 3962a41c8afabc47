"""The algorithms; importing this package registers every one of them."""

from . import reference  # noqa: F401
