"""Backend adapters, one per library, found by name and imported only when used."""
from .registry import BACKENDS, availability, create, names

__all__ = ["BACKENDS", "availability", "create", "names"]
