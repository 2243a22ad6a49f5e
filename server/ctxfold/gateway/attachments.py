"""What the text fields cannot hold (images, documents, files): a one-line description for the
canonical text, so a summary that folds the message names it instead of carrying it, and the
tokens the provider counts for an image, by its documented formula (the dimensions come from the
image's own header when the data is inline)."""

from __future__ import annotations

import base64
import binascii
import math
import struct
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

# Inline data decoded to find the dimensions: a JPEG's frame header follows its EXIF segment.
HEADER_BYTES = 64 << 10
# When the dimensions are unknown (a URL, a file id): the most a provider counts for one image.
ANTHROPIC_UNKNOWN_IMAGE_TOKENS = 1600
OPENAI_UNKNOWN_IMAGE_TOKENS = 765
# Documents and files: about a page of text each when nothing better is known.
UNKNOWN_DOCUMENT_TOKENS = 1500


@dataclass(frozen=True)
class Attachment:
    """One part of a message that is not text."""

    kind: str  # "image", "document", "file", "audio", or the block type
    name: str  # a file name, a URL's last segment, a media type or a title
    width: int = 0
    height: int = 0

    def describe(self) -> str:
        size = f", {self.width}x{self.height}" if self.width and self.height else ""
        return f"[{self.kind}: {self.name or 'unnamed'}{size}]"


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG, GIF, WebP or JPEG header; (0, 0) when it is none of them."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    return 0, 0


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return 0, 0


def _jpeg_size(data: bytes) -> tuple[int, int]:
    index = 2
    while index + 9 < len(data):
        if data[index] != 0xFF:
            return 0, 0
        marker = data[index + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            index += 2
            continue
        length = int.from_bytes(data[index + 2 : index + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return int(width), int(height)
        index += 2 + length
    return 0, 0


def inline_image_size(base64_data: str) -> tuple[int, int]:
    """The size of a base64 image from its first bytes only."""
    head = base64_data[: HEADER_BYTES * 4 // 3 // 4 * 4]
    try:
        return image_size(base64.b64decode(head, validate=False))
    except (binascii.Error, ValueError):
        return 0, 0


def data_url_size(url: str) -> tuple[str, int, int]:
    """(media type, width, height) of a `data:` URL; ("", 0, 0) for any other URL."""
    if not url.startswith("data:") or "," not in url:
        return "", 0, 0
    header, data = url[5:].split(",", 1)
    media_type = header.split(";", 1)[0]
    width, height = inline_image_size(data) if header.endswith(";base64") else (0, 0)
    return media_type, width, height


def url_name(url: str) -> str:
    if url.startswith("data:"):
        return url[5:].split(";", 1)[0].split(",", 1)[0]
    segment = urlsplit(url).path.rsplit("/", 1)[-1]
    return unquote(segment) or url[:80]


def image_from_url(url: str) -> Attachment:
    media_type, width, height = data_url_size(url)
    return Attachment("image", media_type or url_name(url), width, height)


def anthropic_image_tokens(width: int, height: int) -> int:
    """Anthropic's formula: width × height / 750, after the image is scaled to a long edge of at most
    1568 pixels and about 1.15 megapixels (docs: "Vision", "Calculate image costs")."""
    if not width or not height:
        return ANTHROPIC_UNKNOWN_IMAGE_TOKENS
    scale = min(1.0, 1568 / max(width, height), math.sqrt(1_150_000 / (width * height)))
    return math.ceil(int(width * scale) * int(height * scale) / 750)


def openai_image_tokens(width: int, height: int, detail: str = "auto") -> int:
    """OpenAI's tile formula: 85 for `low` detail; else the image is fit within 2048×2048, its
    shortest side scaled down to 768, and each 512-pixel tile costs 170 on top of 85."""
    if detail == "low":
        return 85
    if not width or not height:
        return OPENAI_UNKNOWN_IMAGE_TOKENS
    fit = min(1.0, 2048 / max(width, height))
    shortest = min(1.0, 768 / (min(width, height) * fit))
    scaled_width, scaled_height = width * fit * shortest, height * fit * shortest
    return 85 + 170 * math.ceil(scaled_width / 512) * math.ceil(scaled_height / 512)
