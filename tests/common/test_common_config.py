"""parse_config: flags beat environment beat defaults; nested ServerConfig fields are flattened."""

import dataclasses
from dataclasses import dataclass, field

import pytest

from salon.common.config import parse_config
from salon.common.server import ServerConfig


@dataclass(frozen=True)
class DemoConfig:
    """Demo service."""

    server: ServerConfig = field(default_factory=ServerConfig)
    capacity_bytes: int = 1024
    ratio: float = 0.5
    name: str = "demo"
    peers: tuple[str, ...] = ()
    shared_memory: bool = True
    salt: str | None = None


def test_defaults():
    cfg = parse_config(DemoConfig, [], env_prefix="SALON_DEMO_", environ={})
    assert cfg == DemoConfig()
    assert cfg.server.port == 0 and cfg.server.metrics_port is None


def test_env_then_flags():
    env = {
        "SALON_DEMO_PORT": "7001",
        "SALON_DEMO_CAPACITY_BYTES": "4096",
        "SALON_DEMO_SHARED_MEMORY": "false",
        "SALON_DEMO_PEERS": "a:1,b:2",
    }
    cfg = parse_config(DemoConfig, [], env_prefix="SALON_DEMO_", environ=env)
    assert (cfg.server.port, cfg.capacity_bytes, cfg.shared_memory, cfg.peers) == (7001, 4096, False, ("a:1", "b:2"))
    cfg = parse_config(
        DemoConfig, ["--port", "7002", "--ratio", "0.25", "--salt", "x"], env_prefix="SALON_DEMO_", environ=env
    )
    assert (cfg.server.port, cfg.ratio, cfg.salt, cfg.capacity_bytes) == (7002, 0.25, "x", 4096)


def test_bad_values_exit_with_a_message(capsys):
    with pytest.raises(SystemExit):
        parse_config(DemoConfig, ["--capacity-bytes", "lots"], env_prefix="SALON_DEMO_", environ={})
    assert "capacity-bytes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(DemoConfig, [], env_prefix="SALON_DEMO_", environ={"SALON_DEMO_SHARED_MEMORY": "maybe"})
    assert "SALON_DEMO_SHARED_MEMORY" in capsys.readouterr().err


def test_config_is_frozen():
    cfg = parse_config(DemoConfig, [], env_prefix="SALON_DEMO_", environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "other"  # type: ignore[misc]
