"""The netns backend says what this machine lacks before anything runs."""

from __future__ import annotations

import pytest

from commscope.cluster import machine


def test_not_root_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine.os, "geteuid", lambda: 1000)
    problems = machine.preflight_problems()
    assert any("needs root" in p for p in problems)


def test_missing_tools_name_their_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(machine.shutil, "which", lambda tool: None)
    monkeypatch.setattr(machine.os, "access", lambda path, mode: False)
    problems = machine.preflight_problems()
    assert any("apt-get install iproute2" in p for p in problems)
    assert any("openssh-server" in p for p in problems)
    assert any("openssh-client" in p for p in problems)
