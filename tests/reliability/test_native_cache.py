"""The native kernel cache loads only a library of the user's own private folder whose hash
is the one recorded when it was built; anything else: a warning and the PyTorch path."""

from __future__ import annotations

import ctypes
import os
import shutil
import warnings

import pytest

from r2ac.rtrl.elstm import native

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler")


@pytest.fixture()
def loads(monkeypatch, tmp_path):
    """A fresh load() state, the cache under tmp_path/cache; returns the paths CDLL opened."""
    opened: list[str] = []
    real_cdll = ctypes.CDLL

    def recording_cdll(name, *args, **kwargs):
        opened.append(str(name))
        return real_cdll(name, *args, **kwargs)

    monkeypatch.setattr(native.ctypes, "CDLL", recording_cdll)
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("R2AC_NATIVE", "1")
    monkeypatch.setenv("R2AC_NATIVE_CACHE", str(tmp_path / "cache"))
    return opened


def _reset(monkeypatch):
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)


@needs_cc
def test_cache_is_created_private_and_the_library_hash_is_recorded(loads, tmp_path):
    assert native.load() is not None
    cache = tmp_path / "cache"
    assert cache.stat().st_mode & 0o777 == 0o700
    [library] = cache.glob("*.so")
    assert loads == [str(library)]
    recorded = (cache / (library.name + ".sha256")).read_text().strip()
    assert recorded == native._sha256(library)


@needs_cc
def test_a_replaced_library_is_not_loaded(loads, tmp_path, monkeypatch):
    assert native.load() is not None
    [library] = (tmp_path / "cache").glob("*.so")
    data = library.read_bytes()
    library.unlink()  # a new file: rewriting the one this process has mapped would crash it
    library.write_bytes(data[:-64] + b"\0" * 64)  # same name, other bytes
    _reset(monkeypatch)
    loads.clear()
    with pytest.warns(RuntimeWarning, match="does not match the hash"):
        assert native.load() is None
    assert loads == []


@needs_cc
def test_a_planted_library_without_a_hash_is_rebuilt_over(loads, tmp_path, monkeypatch):
    assert native.load() is not None
    [library] = (tmp_path / "cache").glob("*.so")
    good = library.read_bytes()
    (tmp_path / "cache" / (library.name + ".sha256")).unlink()
    library.unlink()
    library.write_bytes(b"\x7fELF planted")
    _reset(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load() is not None
    assert library.read_bytes() == good


def test_a_folder_others_can_write_is_refused(loads, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    (cache / "elstm_carry-0000000000000000.so").write_bytes(b"planted")
    with pytest.warns(RuntimeWarning, match="writable by others"):
        assert native.load() is None
    assert loads == []
    assert sorted(p.name for p in cache.iterdir()) == ["elstm_carry-0000000000000000.so"]


def test_a_folder_of_another_user_is_refused(loads, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr(native.os, "getuid", lambda: cache.stat().st_uid + 1)
    with pytest.warns(RuntimeWarning, match="belongs to uid"):
        assert native.load() is None
    assert loads == []


def test_a_link_is_refused(loads, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(target)
    with pytest.warns(RuntimeWarning, match="not a folder"):
        assert native.load() is None
    assert loads == []


def test_a_folder_r2ac_created_is_tightened_to_0700(tmp_path):
    cache = tmp_path / "cache"
    assert native.secure_dir(cache) == cache  # created: marked as r2ac's
    os.chmod(cache, 0o755)
    assert native.secure_dir(cache) == cache
    assert cache.stat().st_mode & 0o777 == 0o700


def test_a_folder_r2ac_did_not_create_is_never_changed(loads, tmp_path):
    """R2AC_NATIVE_CACHE naming an existing folder of the user's: refused in one line; its
    mode and its files (even ones named like r2ac's builds) are left as they were."""
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o755)
    (cache / "elstm_carry-0000000000000000.so").write_bytes(b"the user's own file")
    with pytest.warns(RuntimeWarning) as caught:
        assert native.load() is None
    [warning] = caught
    message = str(warning.message)
    assert "r2ac did not create" in message and "\n" not in message
    assert loads == []
    assert cache.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in cache.iterdir()] == ["elstm_carry-0000000000000000.so"]
