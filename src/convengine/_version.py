"""The single source of convengine's version."""

__version__ = "0.1.0"
