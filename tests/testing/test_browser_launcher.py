"""The tests' headless Chromium (agentrl.testing.browser): what it writes outside its profile goes with it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from agentrl.testing.browser import Chromium, needs_chromium

pytestmark = needs_chromium()


async def test_a_closed_browser_leaves_nothing_in_the_temp_directory(monkeypatch):
    """Its singleton lock dir (``org.chromium.Chromium.XXXXXX``) stayed in /tmp after every browser, one per test."""
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-test-", dir="/tmp"))  # pytest's tmp_path is too long for a socket's
    try:
        monkeypatch.setenv("TMPDIR", str(tmp))
        monkeypatch.setattr(tempfile, "tempdir", None)
        async with Chromium() as browser:
            assert await browser.evaluate("1 + 1") == 2
            assert [p.name[:17] for p in tmp.iterdir()] == ["agentrl-chromium-"]
        assert list(tmp.iterdir()) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
