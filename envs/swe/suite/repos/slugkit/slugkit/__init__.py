"""URL slugs."""

from .slug import slugify, unique_slug

__all__ = ["slugify", "unique_slug"]
