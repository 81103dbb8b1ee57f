"""Every tool test runs from the repository root: recipes resolve relative paths against the current directory
(SpecForge's rule, which draftforge and tools/reference follow), and the fixtures' recipes are written for it."""
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.fixture(autouse=True)
def _run_from_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)
