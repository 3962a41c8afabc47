"""Moving tuning results between machines as JSON.

The file holds ``{"format": "convengine-tuning-cache", "format_version": 1,
"host": ..., "convengine": ..., "entries": [...]}``. Import validates every entry,
refuses those measured on another host signature (timings from another CPU are
not evidence here) unless ``force`` rebinds them to this host, and skips those of
another convengine version or candidate set, which no lookup would ever match.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from . import keys
from .cache import EXPORT_FORMAT, Entry
from .tuner import default_cache

FORMAT_VERSION = 1


def export_cache(path: str | Path) -> int:
    """Write every entry of the current cache to ``path``; returns how many."""
    entries = default_cache().entries()
    document = {
        "format": EXPORT_FORMAT,
        "format_version": FORMAT_VERSION,
        "host": keys.host_signature(),
        "convengine": keys.version(),
        "entries": [e.to_json() for e in entries],
    }
    Path(path).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return len(entries)


@dataclass(frozen=True)
class ImportReport:
    """Counts of what an import did with the file's entries."""

    imported: int
    refused_host: int
    stale: int

    def __str__(self) -> str:
        text = f"imported {self.imported} entries"
        if self.refused_host:
            text += (f"; refused {self.refused_host} measured on another host "
                     f"(use --force / force=True to take them as this host's)")
        if self.stale:
            text += (f"; skipped {self.stale} from another convengine version or "
                     f"algorithm set")
        return text


def import_cache(path: str | Path, *, force: bool = False) -> ImportReport:
    """Read a file written by :func:`export_cache` into the current cache.

    ValueError (naming the entry and field) if the file is not a valid export;
    nothing is imported then.
    """
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path} is not a convengine tuning cache export "
                         f"(expected \"format\": \"{EXPORT_FORMAT}\")")
    if document.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {document.get('format_version')!r}; "
                         f"this convengine reads {FORMAT_VERSION}")
    raw = document.get("entries")
    if not isinstance(raw, list):
        raise ValueError(f"{path}: 'entries' must be a list")
    entries = [Entry.from_json(e, f"{path}: entries[{i}]") for i, e in enumerate(raw)]
    host, version = keys.host_signature(), keys.version()
    accepted, refused, stale = [], 0, 0
    for e in entries:
        if e.version != version or e.candidates != keys.candidate_checksum(e.pass_):
            stale += 1
        elif e.host != host and not force:
            refused += 1
        else:
            accepted.append(dataclasses.replace(e, host=host))
    default_cache().put(accepted)
    return ImportReport(len(accepted), refused, stale)
