"""The compiled gettext catalogs a project's build writes and git ignores, compiled from their
`.po` sources into the checkout (`workspace.catalogs`), read back by the standard library's own
`gettext` as the project's tests read them."""

from __future__ import annotations

import gettext
import os
from pathlib import Path

from fleet_pipelines.workspace.catalogs import MAX_CATALOG_BYTES, write_catalogs

HEADER = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n"Language: {language}\\n"\n'
HEADER += '"Plural-Forms: nplurals=2; plural=(n != 1);\\n"\n\n'
ENTRIES = (
    'msgid "second"\nmsgid_plural "seconds"\nmsgstr[0] "seconde"\nmsgstr[1] "secondes"\n\n'
    'msgctxt "0 (male)"\nmsgid "th"\nmsgstr "e"\n\n'
    '#, fuzzy\nmsgid "yesterday"\nmsgstr "hier?"\n\n'
    'msgid "today"\nmsgstr "aujourd\'hui"\n'
)


def _catalog(project: Path, language: str, text: str) -> Path:
    folder = project / "src" / "pkg" / "locale" / language / "LC_MESSAGES"
    folder.mkdir(parents=True)
    (folder / "pkg.po").write_text(text)
    return folder


def test_a_catalog_the_checkout_lacks_is_compiled_and_gettext_reads_it(tmp_path):
    folder = _catalog(tmp_path, "fr_FR", HEADER.format(language="fr_FR") + ENTRIES)
    os.chmod(folder, 0o555)  # the checkout is read-only
    assert write_catalogs(tmp_path) == [
        "src/pkg/locale/fr_FR/LC_MESSAGES/pkg.mo (3 messages, compiled from pkg.po)"
    ]
    assert (folder / "pkg.mo").stat().st_mode & 0o777 == 0o444 and folder.stat().st_mode & 0o777 == 0o555
    translation = gettext.translation("pkg", tmp_path / "src" / "pkg" / "locale", ["fr_FR"])
    assert translation.ngettext("second", "seconds", 1) == "seconde"
    assert translation.ngettext("second", "seconds", 3) == "secondes"
    assert translation.pgettext("0 (male)", "th") == "e"
    assert translation.gettext("today") == "aujourd'hui"
    assert translation.gettext("yesterday") == "yesterday"  # fuzzy: left out, as msgfmt leaves it


def test_a_compiled_catalog_is_left_alone_and_one_outside_lc_messages_or_through_a_link_is_not_read(tmp_path):
    folder = _catalog(tmp_path, "de", HEADER.format(language="de") + ENTRIES)
    (folder / "pkg.mo").write_bytes(b"the project's own")
    elsewhere = tmp_path / "po"
    elsewhere.mkdir()
    (elsewhere / "pkg.po").write_text(HEADER.format(language="it") + ENTRIES)
    linked = tmp_path / "locale" / "it"
    linked.mkdir(parents=True)
    (linked / "LC_MESSAGES").symlink_to(elsewhere)
    assert write_catalogs(tmp_path) == []
    assert (folder / "pkg.mo").read_bytes() == b"the project's own"
    assert not (elsewhere / "pkg.mo").exists()


def test_a_catalog_babel_cannot_read_is_listed_not_written_and_the_others_still_are(tmp_path):
    # humanize 4.11.0's Arabic catalog says `Language: arabic (عربي)`: GNU msgfmt compiles it,
    # Babel refuses its locale name
    bad = _catalog(tmp_path, "ar", HEADER.format(language="arabic (عربي)") + ENTRIES)
    good = _catalog(
        tmp_path, "fr", HEADER.format(language="fr") + 'msgid "a"\nmsgstr "b"\n\nthis is not po\n'
    )
    written = write_catalogs(tmp_path)
    assert written[0].startswith("src/pkg/locale/ar/LC_MESSAGES/pkg.mo: not written, pkg.po does not parse: ")
    assert written[1] == (
        "src/pkg/locale/fr/LC_MESSAGES/pkg.mo (1 messages, compiled from pkg.po, "
        "1 of its lines not understood)"
    )
    assert not (bad / "pkg.mo").exists() and (good / "pkg.mo").exists()


def test_catalogs_past_the_size_cap_are_listed_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr("fleet_pipelines.workspace.catalogs.MAX_CATALOG_BYTES", 1000)
    assert MAX_CATALOG_BYTES > 1000
    _catalog(tmp_path, "de", HEADER.format(language="de") + ENTRIES)
    _catalog(tmp_path, "fr", HEADER.format(language="fr") + ENTRIES + "#" * 1000 + "\n")
    assert write_catalogs(tmp_path) == [
        "src/pkg/locale/de/LC_MESSAGES/pkg.mo (3 messages, compiled from pkg.po)",
        "src/pkg/locale/fr/LC_MESSAGES/pkg.mo: not written, the catalogs pass 1000 bytes",
    ]
