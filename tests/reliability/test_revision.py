"""Every run records the commit it ran at, from a checkout and from a tree exported by
`git archive` (r2ac/REVISION, expanded through .gitattributes' export-subst)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from r2ac.runs.locked_dir import archived_revision, git_revision

ROOT = Path(__file__).resolve().parents[2]


def test_archived_revision_takes_a_commit_and_refuses_the_placeholder():
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert archived_revision(commit + "\n") == commit
    assert archived_revision("$Format:%H$\n") == "unknown"
    assert archived_revision("") == "unknown"
    assert archived_revision(commit[:10]) == "unknown"


def _head() -> str | None:
    if shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def test_a_checkout_records_its_head():
    head = _head()
    if head is None:
        pytest.skip("not a git checkout")
    assert git_revision() == head


def test_a_tree_exported_by_git_archive_records_its_commit(tmp_path):
    head = _head()
    if head is None:
        pytest.skip("not a git checkout")
    tar = tmp_path / "head.tar"
    subprocess.run(["git", "archive", "-o", str(tar), "HEAD"], cwd=ROOT, check=True)
    out = tmp_path / "tree"
    with tarfile.open(tar) as t:
        t.extractall(out, filter="data")
    code = "from r2ac.runs.locked_dir import git_revision; print(git_revision())"
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(out), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == head
