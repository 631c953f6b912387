"""The compiled message catalogs a project's tests read, written into the checkout.

Projects translated with gettext keep the source catalogs (`locale/<lang>/LC_MESSAGES/<domain>.po`)
in git and compile them to the `.mo` files `gettext.translation` reads as a build step of their
own (`msgfmt`, a script, a tox step), ignoring the `.mo` in git. A checkout lacks them, so the
tests of the translations skip or fail where the project's CI and its sdist pass them (humanize
4.11.0: 23 tests). The judge runs no build script, so each `.po` under a `LC_MESSAGES` folder
whose `.mo` the checkout lacks is compiled here, with Babel's reader and writer (`babel.messages`:
parsing only, nothing of the catalog is evaluated), leaving out fuzzy entries and untranslated
plurals as `msgfmt` does (on humanize's 33 catalogs, `gettext` reads the same messages from these
as from GNU msgfmt's).

Babel checks header fields that gettext never reads (`Language`, the dates) where msgfmt does
not: a catalog it refuses for one is compiled without them, and its line says so. A catalog
through a symbolic link is not read; one that still does not parse is listed, not written; past
`MAX_CATALOG_BYTES` of catalogs in all, the rest are listed, not written.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po

from .version_files import write_generated

MAX_CATALOG_BYTES = 32 * 1024 * 1024
_CHECKED_FIELD = re.compile(rb'^"(Language|POT-Creation-Date|PO-Revision-Date):.*"\s*$')


def source_catalogs(project: Path) -> list[Path]:
    """The `.po` files under `LC_MESSAGES` folders of the checkout whose `.mo` it lacks, sorted;
    none reached through a symbolic link."""
    found = []
    for directory, folders, files in os.walk(project):
        folders[:] = sorted(
            f for f in folders if f != ".git" and not os.path.islink(os.path.join(directory, f))
        )
        if os.path.basename(directory) != "LC_MESSAGES":
            continue
        for name in sorted(files):
            path = Path(directory, name)
            if (
                name.endswith(".po")
                and not path.is_symlink()
                and not os.path.lexists(path.with_suffix(".mo"))
            ):
                found.append(path)
    return found


def _without_checked_header_fields(text: bytes) -> bytes:
    """`text` without the header entry's fields Babel checks and gettext never reads (`Language`,
    the dates): GNU msgfmt compiles `Language: arabic (عربي)` and an empty `PO-Revision-Date`
    (humanize 4.11.0's ar and uk_UA catalogs), Babel refuses them."""
    header, blank, rest = text.partition(b"\n\n")
    kept = [line for line in header.split(b"\n") if not _CHECKED_FIELD.match(line)]
    return b"\n".join(kept) + blank + rest


def _compile(text: bytes) -> tuple[bytes, int, int]:
    """The `.mo` of a `.po` text, its messages and the lines Babel skipped (it prints "WARNING:
    Problem on line N" for each: counted here)."""
    problems = io.StringIO()
    with contextlib.redirect_stdout(problems):
        catalog = read_po(io.BytesIO(text))
    for message in list(catalog):  # msgfmt leaves out a plural whose first form is untranslated;
        if message.id and isinstance(message.string, tuple) and not message.string[0]:  # Babel
            catalog.delete(message.id, message.context)  # would write it, and ngettext would say ""
    compiled = io.BytesIO()
    write_mo(compiled, catalog)
    entries = sum(1 for message in catalog if message.id and message.string and not message.fuzzy)
    return compiled.getvalue(), entries, problems.getvalue().count("WARNING: Problem on line")


def write_catalogs(project: Path) -> list[str]:
    """Compiles the catalogs `source_catalogs` finds; one line for each (its `.mo` path relative
    to `project`, the entries written), or why it was not written."""
    written, total = [], 0
    for source in source_catalogs(project):
        relative = source.with_suffix(".mo").relative_to(project)
        total += source.stat().st_size
        if total > MAX_CATALOG_BYTES:
            written.append(f"{relative}: not written, the catalogs pass {MAX_CATALOG_BYTES} bytes")
            continue
        text, notes = source.read_bytes(), []
        try:
            try:
                compiled, entries, skipped = _compile(text)
            except ValueError as refused:  # a header field Babel checks: compiled without those
                compiled, entries, skipped = _compile(_without_checked_header_fields(text))
                notes.append(f"its header's Language and dates left out (Babel: {refused})"[:200])
        except Exception as error:  # Babel raises what the text makes it raise; the line says which
            why = f"{type(error).__name__}: {error}"
            written.append(f"{relative}: not written, {source.name} does not parse: {why}"[:300])
            continue
        write_generated(source.with_suffix(".mo"), compiled)
        if skipped:
            notes.append(f"{skipped} of its lines not understood")
        note = "".join(f", {n}" for n in notes)
        written.append(f"{relative} ({entries} messages, compiled from {source.name}{note})")
    return written
