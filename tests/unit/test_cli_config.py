"""Layered configuration: flags over CHRONOQ_* variables over the TOML file over defaults."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from chronoq.cli import app


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, env=env or {})
    return result.exit_code, result.output


def rows(output: str) -> dict[str, tuple[str, str]]:
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 3 and cells[0].startswith("--"):
            out[cells[0]] = (cells[1], cells[2])
    return out


def test_each_setting_says_where_it_came_from(tmp_path: Path) -> None:
    config = tmp_path / "chronoq.toml"
    config.write_text(
        '[node]\ndsn = "postgresql://app:hunter2@db/chronoq"\nport = 7999\ntick-ms = 50\n'
        "lease-ttl = 9\n"
    )
    code, output = run(
        ["--config", str(config), "config", "--lease-ttl", "3"],
        env={"CHRONOQ_TICK_MS": "75", "COLUMNS": "200"},
    )
    assert code == 0, output
    got = rows(output)
    assert got["--port"] == ("7999", "file")
    assert got["--tick-ms"] == ("75", "env CHRONOQ_TICK_MS")  # env beats the file
    assert got["--lease-ttl"] == ("3", "flag")  # a flag beats both
    assert got["--partitions"] == ("256", "default")
    assert got["--dsn"] == ("postgresql://app:***@db/chronoq", "file")  # no password shown
    assert "hunter2" not in output


def test_bad_config_files_get_one_clear_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[node\nport = ")
    code, output = run(["--config", str(broken), "config"])
    assert code == 2 and "is not valid TOML" in output and "Traceback" not in output
    code, output = run(["--config", str(tmp_path / "missing.toml"), "config"])
    assert code == 2 and "cannot read --config" in output


def test_node_without_a_dsn_says_where_one_can_come_from() -> None:
    code, output = run(["node"], env={"COLUMNS": "200"})
    assert code == 2 and "CHRONOQ_DSN" in output


def test_config_masks_passwords_wherever_they_sit(tmp_path: Path) -> None:
    dsns = {
        "postgresql://app:hunter2@db/chronoq?sslmode=require": "postgresql://app:***@db/chronoq"
        "?sslmode=require",
        "postgresql://app@db/chronoq?password=hunter2": "postgresql://app@db/chronoq?password=***",
        "host=db user=app password=hunter2 dbname=chronoq": "host=db user=app password=*** "
        "dbname=chronoq",
    }
    for dsn, shown in dsns.items():
        code, output = run(
            ["config", "--etcd", "http://root:hunter2@etcd:2379"],
            env={"CHRONOQ_DSN": dsn, "CHRONOQ_ETCD_PASSWORD": "hunter2", "COLUMNS": "250"},
        )
        assert code == 0, output
        got = rows(output)
        assert got["--dsn"] == (shown, "env CHRONOQ_DSN")
        assert got["--etcd-password"] == ("***", "env CHRONOQ_ETCD_PASSWORD")
        assert got["--etcd"] == ("http://root:***@etcd:2379", "flag")
        assert "hunter2" not in output
