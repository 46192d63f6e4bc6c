"""AdmissionConfig: validation, from_env with its fallbacks, and what the factory builds from it."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from asgi_admission import AdmissionConfig, CgroupMemoryReader, HostMemoryReader
from asgi_admission._factory import build_controller, build_reader
from asgi_admission._memory.host import host_headroom_bytes
from kits.suitekit import GIB, MIB

#: Internal on purpose: the factory that turns a configuration into a reader and a latch.
INTERNAL = "the factory that turns a configuration into a reader and a latch"


def test_defaults_match_the_spec() -> None:
    """An empty environment gives the documented defaults."""
    assert AdmissionConfig.from_env({}) == AdmissionConfig(
        high_watermark_percent=80.0,
        resume_threshold_percent=70.0,
        reserve_bytes=None,
        max_sessions=None,
        retry_after_s=5,
        cgroup_root=None,
        memory_source="cgroup",
        reclaimable="file",
        shared_dir="auto",
        reserve_learning="raise",
        reserve_min_bytes=16 * MIB,
        pending_timeout_s=120.0,
        websocket_refusal="auto",
        probe_sessions=1,
        probe_wait_s=5.0,
        stuck_after_s=300.0,
        liveness_path=None,
    )


def test_every_variable_is_read(caplog: pytest.LogCaptureFixture) -> None:
    """Each ADMISSION_* variable sets its field, with no warning."""
    env = {
        "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": "90",
        "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": " 60.5 ",
        "ADMISSION_SESSION_RESERVE_MB": "256",
        "ADMISSION_CGROUP_ROOT": "/sys/fs/cgroup/app",
        "ADMISSION_MAX_SESSIONS": "4",
        "ADMISSION_RETRY_AFTER_SECONDS": "12",
        "ADMISSION_MEMORY_SOURCE": "HOST",
        "ADMISSION_SHARED_DIR": "/run/admission",
        "ADMISSION_RECLAIMABLE": "inactive",
        "ADMISSION_SESSION_RESERVE_LEARNING": "Adapt",
        "ADMISSION_SESSION_RESERVE_MIN_MB": "32",
        "ADMISSION_PENDING_TIMEOUT_SECONDS": "30.5",
        "ADMISSION_WEBSOCKET_REFUSAL": " Close ",
        "ADMISSION_PROBE_SESSIONS": "2",
        "ADMISSION_PROBE_WAIT_SECONDS": "7.5",
        "ADMISSION_STUCK_AFTER_SECONDS": "600",
        "ADMISSION_LIVENESS_PATH": " /admission/alive ",
    }
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env(env)
    assert config == AdmissionConfig(
        high_watermark_percent=90.0,
        resume_threshold_percent=60.5,
        reserve_bytes=256 * MIB,
        max_sessions=4,
        retry_after_s=12,
        cgroup_root="/sys/fs/cgroup/app",
        memory_source="host",
        reclaimable="inactive",
        shared_dir="/run/admission",
        reserve_learning="adapt",
        reserve_min_bytes=32 * MIB,
        pending_timeout_s=30.5,
        websocket_refusal="close",
        probe_sessions=2,
        probe_wait_s=7.5,
        stuck_after_s=600.0,
        liveness_path="/admission/alive",
    )
    assert caplog.records == []


def test_legacy_names_are_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The reference's CODA_* names still work, each with one warning naming the new name."""
    env = {
        "CODA_MEMORY_HIGH_WATERMARK_PERCENT": "85",
        "CODA_MEMORY_RESUME_THRESHOLD_PERCENT": "75",
        "CODA_BROWSER_SESSION_RESERVE_MB": "512",
        "CODA_CGROUP_V2_ROOT": "/cg",
    }
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env(env)
    assert (config.high_watermark_percent, config.resume_threshold_percent) == (85.0, 75.0)
    assert (config.reserve_bytes, config.cgroup_root) == (512 * MIB, "/cg")
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 4
    assert "CODA_BROWSER_SESSION_RESERVE_MB is a legacy name; set ADMISSION_SESSION_RESERVE_MB" in (
        " ".join(messages)
    )


def test_current_name_wins_over_legacy(caplog: pytest.LogCaptureFixture) -> None:
    """With both names set, the ADMISSION_* one is used and the legacy one is reported ignored."""
    env = {"ADMISSION_SESSION_RESERVE_MB": "100", "CODA_BROWSER_SESSION_RESERVE_MB": "900"}
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert AdmissionConfig.from_env(env).reserve_bytes == 100 * MIB
    assert [r.getMessage() for r in caplog.records] == [
        "ADMISSION_SESSION_RESERVE_MB is set, so the legacy CODA_BROWSER_SESSION_RESERVE_MB "
        "is ignored."
    ]


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        ("ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT", "lots", "high_watermark_percent", 80.0),
        ("ADMISSION_SESSION_RESERVE_MB", "1.5", "reserve_bytes", None),
        ("CODA_BROWSER_SESSION_RESERVE_MB", "x", "reserve_bytes", None),
        ("ADMISSION_SESSION_RESERVE_MB", "-5", "reserve_bytes", 0),
        ("ADMISSION_MAX_SESSIONS", "-1", "max_sessions", None),
        ("ADMISSION_MAX_SESSIONS", "many", "max_sessions", None),
        ("ADMISSION_RETRY_AFTER_SECONDS", "0", "retry_after_s", 5),
        ("ADMISSION_MEMORY_SOURCE", "psutil", "memory_source", "cgroup"),
        ("ADMISSION_RECLAIMABLE", "all", "reclaimable", "file"),
        ("ADMISSION_WEBSOCKET_REFUSAL", "1013", "websocket_refusal", "auto"),
    ],
)
def test_each_fallback_logs_one_warning_naming_the_variable(
    caplog: pytest.LogCaptureFixture, variable: str, value: str, field: str, expected: object
) -> None:
    """A bad value falls back (a negative reserve to 0) with a warning naming the variable."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env({variable: value})
    assert getattr(config, field) == expected
    fallback = [r.getMessage() for r in caplog.records if "legacy name" not in r.getMessage()]
    assert len(fallback) == 1
    assert fallback[0].startswith(f"{variable}=")


@pytest.mark.parametrize(
    "env",
    [
        {
            "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": "60",
            "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": "75",
        },
        {"ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": "120"},
        {"ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": "nan"},
        {"ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": "0"},
    ],
    ids=["resume above high", "high above 100", "nan", "resume zero"],
)
def test_inconsistent_watermarks_fall_back_to_defaults_and_default_reserve(
    caplog: pytest.LogCaptureFixture, env: dict[str, str]
) -> None:
    """A self-inconsistent set restores the default watermarks and the derived reserve."""
    env = {**env, "ADMISSION_SESSION_RESERVE_MB": "64"}
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env(env)
    assert (config.high_watermark_percent, config.resume_threshold_percent) == (80.0, 70.0)
    assert config.reserve_bytes is None
    assert len(caplog.records) == 1
    assert "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT" in caplog.records[0].getMessage()


def test_blank_values_mean_unset(caplog: pytest.LogCaptureFixture) -> None:
    """Empty or blank variables count as unset, without warnings."""
    env = {
        "ADMISSION_CGROUP_ROOT": "  ",
        "ADMISSION_MAX_SESSIONS": "",
        "ADMISSION_MEMORY_SOURCE": "",
    }
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert AdmissionConfig.from_env(env) == AdmissionConfig()
    assert caplog.records == []


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a mapping, from_env reads the process environment."""
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "3")
    assert AdmissionConfig.from_env().max_sessions == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"resume_threshold_percent": 90.0},
            "resume_threshold_percent and high_watermark_percent must satisfy "
            "0 < resume <= high <= 100; got resume=90.0, high=80.0.",
        ),
        (
            {"high_watermark_percent": float("inf")},
            "resume_threshold_percent and high_watermark_percent must satisfy "
            "0 < resume <= high <= 100; got resume=70.0, high=inf.",
        ),
        (
            {"reserve_bytes": -1},
            "reserve_bytes must be 0 or more, or None to derive it from the memory limit; got -1.",
        ),
        ({"max_sessions": -1}, "max_sessions must be 0 or more; got -1."),
        (
            {"retry_after_s": 0},
            "retry_after_s must be a whole number of seconds, 1 or more; got 0.",
        ),
        ({"memory_source": "disk"}, "memory_source must be 'cgroup' or 'host'; got 'disk'."),
        ({"reclaimable": "all"}, "reclaimable must be 'file' or 'inactive'; got 'all'."),
        (
            {"reserve_learning": "more"},
            "reserve_learning must be 'raise', 'adapt' or 'off'; got 'more'.",
        ),
        ({"reserve_min_bytes": -1}, "reserve_min_bytes must be 0 or more; got -1."),
        (
            {"pending_timeout_s": 0.0},
            "pending_timeout_s (ADMISSION_PENDING_TIMEOUT_SECONDS) must be a number of "
            "seconds above 0; got 0.0.",
        ),
        (
            {"websocket_refusal": "reject"},
            "websocket_refusal must be 'auto', 'close' or 'deny'; got 'reject'.",
        ),
        (
            {"probe_sessions": -1},
            "probe_sessions (ADMISSION_PROBE_SESSIONS) must be a whole number of sessions, "
            "0 or more; got -1.",
        ),
        (
            {"stuck_after_s": -1.0},
            "stuck_after_s (ADMISSION_STUCK_AFTER_SECONDS) must be a number of seconds, 0 "
            "(never call the pressure stuck) or more; got -1.0.",
        ),
        (
            {"liveness_path": "alive"},
            "liveness_path (ADMISSION_LIVENESS_PATH) must be a path starting with '/', or None "
            "for none; got 'alive'.",
        ),
        (
            {"probe_wait_s": 0.0},
            "probe_wait_s (ADMISSION_PROBE_WAIT_SECONDS) must be a number of seconds above 0; "
            "got 0.0.",
        ),
    ],
)
def test_invalid_config_in_code_raises_a_sentence(kwargs: dict[str, object], message: str) -> None:
    """Building a config in code with a bad value raises ValueError naming the setting."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        AdmissionConfig(**kwargs)  # type: ignore[arg-type]


def test_factory_builds_cgroup_reader_and_controller(tmp_path: Path) -> None:
    """build_controller wires the thresholds and a cgroup reader for the configured root."""
    (tmp_path / "memory.current").write_text("100\n")
    (tmp_path / "memory.max").write_text("1000\n")
    config = AdmissionConfig(
        high_watermark_percent=90,
        resume_threshold_percent=50,
        reserve_bytes=0,
        cgroup_root=str(tmp_path),
        reclaimable="inactive",
    )
    reader = build_reader(config)
    assert isinstance(reader, CgroupMemoryReader)
    assert (reader.root, reader.reclaimable) == (str(tmp_path), "inactive")
    controller = build_controller(config)
    assert (controller.high_watermark_percent, controller.resume_threshold_percent) == (90, 50)
    decision = controller.evaluate(0, 1)
    assert (decision.allowed, decision.memory.percent) == (True, 10.0)


def test_factory_builds_host_reader_only_when_asked() -> None:
    """memory_source="host" is the one way to get the host reader."""
    assert isinstance(build_reader(AdmissionConfig(memory_source="host")), HostMemoryReader)


def _vm(total: int, available: int) -> SimpleNamespace:
    return SimpleNamespace(total=total, available=available)


def test_host_reader_keeps_headroom() -> None:
    """The host reader's limit is RAM minus max(10 %, 1 GiB), its usage total minus available."""
    reader = HostMemoryReader(virtual_memory=lambda: _vm(32 * GIB, 20 * GIB))
    reading = reader.read(pressure=True)
    assert reading.limit_bytes == 32 * GIB - int(32 * GIB * 0.1)
    assert (reading.used_bytes, reading.source, reading.available) == (12 * GIB, "host", True)
    assert host_headroom_bytes(4 * GIB) == GIB


@pytest.mark.parametrize(
    "virtual_memory",
    [lambda: _vm(GIB, GIB), lambda: _vm(0, 0), lambda: (_ for _ in ()).throw(OSError("no /proc"))],
    ids=["smaller than headroom", "zero", "psutil fails"],
)
def test_host_reader_unusable_is_unavailable(virtual_memory: object) -> None:
    """A host too small for the headroom, or psutil failing, reads as unavailable."""
    reading = HostMemoryReader(virtual_memory=virtual_memory)()  # type: ignore[arg-type]
    assert (reading.available, reading.source) == (False, "host")


@pytest.mark.parametrize(
    ("name", "value", "field", "default"),
    [
        ("ADMISSION_SESSION_RESERVE_LEARNING", "sometimes", "reserve_learning", "raise"),
        ("ADMISSION_SESSION_RESERVE_MIN_MB", "-3", "reserve_min_bytes", 16 * MIB),
        ("ADMISSION_PENDING_TIMEOUT_SECONDS", "-1", "pending_timeout_s", 120.0),
        ("ADMISSION_PENDING_TIMEOUT_SECONDS", "nan", "pending_timeout_s", 120.0),
        ("ADMISSION_PENDING_TIMEOUT_SECONDS", "soon", "pending_timeout_s", 120.0),
        ("ADMISSION_PROBE_SESSIONS", "-1", "probe_sessions", 1),
        ("ADMISSION_PROBE_SESSIONS", "one", "probe_sessions", 1),
        ("ADMISSION_PROBE_WAIT_SECONDS", "0", "probe_wait_s", 5.0),
        ("ADMISSION_PROBE_WAIT_SECONDS", "inf", "probe_wait_s", 5.0),
        ("ADMISSION_STUCK_AFTER_SECONDS", "-5", "stuck_after_s", 300.0),
        ("ADMISSION_STUCK_AFTER_SECONDS", "inf", "stuck_after_s", 300.0),
        ("ADMISSION_STUCK_AFTER_SECONDS", "later", "stuck_after_s", 300.0),
        ("ADMISSION_LIVENESS_PATH", "alive", "liveness_path", None),
    ],
)
def test_bad_reservation_settings_fall_back_with_one_warning(
    caplog: pytest.LogCaptureFixture, name: str, value: str, field: str, default: object
) -> None:
    """A bad learning mode, floor or timeout falls back to its default, naming the variable."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env({name: value})
    assert getattr(config, field) == default
    assert len(caplog.records) == 1
    assert name in caplog.records[0].getMessage()


def test_shared_dir_is_auto_off_or_a_directory() -> None:
    """ADMISSION_SHARED_DIR unset or blank is "auto", "off"/"auto" in any case are the
    words, anything else a directory; in code None (the old "alone") is refused with a
    message naming both choices."""
    assert AdmissionConfig().shared_dir == "auto"
    for raw, expected in [(" ", "auto"), ("Auto", "auto"), ("OFF", "off"), ("./off", "./off")]:
        assert AdmissionConfig.from_env({"ADMISSION_SHARED_DIR": raw}).shared_dir == expected
    with pytest.raises(ValueError, match=r"'auto'.*'off'.*got None"):
        AdmissionConfig(shared_dir=None)  # type: ignore[arg-type]
