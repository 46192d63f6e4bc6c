"""scripts/commits, which the gate runs: every commit after the rule's start has a short
subject and a body."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kits.suitekit import ROOT


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def repo_with(tmp_path: Path, *messages: str) -> tuple[Path, str]:
    """A repository holding scripts/commits, a first commit, then one per message; the
    first commit's hash."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "commits", repo / "scripts" / "commits")
    git(repo, "init", "-q")
    for key, value in (("user.name", "t"), ("user.email", "t@example.com")):
        git(repo, "config", key, value)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Start\n\nThe rule starts here.")
    first = git(repo, "rev-parse", "HEAD")
    for n, message in enumerate(messages):
        (repo / f"f{n}").write_text(str(n))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
    return repo, first


def check(repo: Path, since: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(repo / "scripts" / "commits"), since], capture_output=True, text=True
    )


def test_commits_with_short_subjects_and_bodies_pass(tmp_path: Path) -> None:
    """A subject of exactly 72 characters with a body is fine."""
    repo, first = repo_with(tmp_path, "x" * 72 + "\n\nWhy it changed.")
    result = check(repo, first)
    assert result.returncode == 0, result.stdout
    assert result.stdout == ""


def test_a_long_subject_or_a_missing_body_fails_naming_the_commit(tmp_path: Path) -> None:
    """A 73-character subject and a subject alone each fail, each named by its hash."""
    repo, first = repo_with(tmp_path, "y" * 73 + "\n\nWhy.", "No body here")
    long_one, no_body = git(repo, "rev-list", "--reverse", f"{first}..HEAD").split()
    result = check(repo, first)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert f"commit {long_one[:7]}: subject of 73 characters (at most 72): {'y' * 73}" in lines
    assert f"commit {no_body[:7]}: no body saying why: No body here" in lines
    assert len(lines) == 2


def test_commits_before_the_start_are_not_checked(tmp_path: Path) -> None:
    """Only commits after SINCE count: the same history checked from its last commit passes."""
    repo, _ = repo_with(tmp_path, "z" * 90)
    assert check(repo, git(repo, "rev-parse", "HEAD")).returncode == 0


def test_a_clone_without_the_start_commit_says_so_and_passes(tmp_path: Path) -> None:
    """A shallow clone or a history without SINCE has nothing to check, and says why."""
    repo, _ = repo_with(tmp_path, "z" * 90)
    result = check(repo, "0" * 40)
    assert result.returncode == 0
    assert "is not in this clone" in result.stdout
