"""What the frontend accepts of images in chat (``image_url`` content parts; docs/api.md,
"Images")."""

from __future__ import annotations

from pydantic import Field, field_validator

from dynamoctl.settings.base import Options


class ImageSettings(Options):
    """Bounds on a request's images and where http(s) image URLs may be fetched from."""

    max_images: int = Field(default=8, ge=0, le=256)
    """Most images one chat request may carry (every message's parts together); more is a
    400 naming ``messages``. 0 refuses every image."""
    max_image_bytes: int = Field(default=4 << 20, ge=1024)
    """Largest image file, in bytes (decoded from its data URL, or fetched); larger is a
    400 naming the part. A data URL also counts against the body limit
    (``max_body_bytes``)."""
    image_fetch_prefixes: str | None = None
    """URL prefixes, separated by commas, from which the frontend fetches ``http(s)``
    image URLs (e.g. ``https://images.example.com/``); an image URL under none of them is
    a 400 naming the part. Unset: only ``data:`` URLs are taken (a frontend that fetches
    any URL a client names would reach whatever its host reaches)."""
    image_fetch_timeout: float = Field(default=5.0, gt=0, le=120)
    """Seconds a fetch may take, connection included, before it is a 400 naming the part."""

    @field_validator("image_fetch_prefixes")
    @classmethod
    def _urls(cls, value: str | None) -> str | None:
        if value is None:
            return None
        for prefix in value.split(","):
            if not prefix.strip().startswith(("http://", "https://")):
                raise ValueError(f"{prefix.strip()!r} is not an http:// or https:// URL prefix")
        return value

    def fetch_prefixes(self) -> tuple[str, ...]:
        """The prefixes allowed, empty when fetching is off."""
        if not self.image_fetch_prefixes:
            return ()
        return tuple(p.strip() for p in self.image_fetch_prefixes.split(",") if p.strip())
