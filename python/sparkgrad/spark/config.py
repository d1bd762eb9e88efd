"""Configuration data of distributed training: enums, VoidConfiguration, hooks.

The repartitioners and the repartitioning enums live with the code that acts on them
(:mod:`sparkgrad.spark.partitioning`).
"""

from __future__ import annotations

import enum
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkgrad._config import Config, check_int
from sparkgrad.spark.partitioning import (
    DefaultRepartitioner,
    EqualRepartitioner,
    NoOpRepartitioner,
    Repartition,
    Repartitioner,
    RepartitionStrategy,
)
from sparkgrad.transport.frame import MIN_SECRET_BYTES

if TYPE_CHECKING:
    from pyspark import StorageLevel


class MeshBuildMode(enum.Enum):
    """Topology of the gradient-sharing network (PLAIN: every worker talks to the controller)."""

    PLAIN = "plain"
    MESH = "mesh"


class RDDTrainingApproach(enum.Enum):
    """How a training master feeds an RDD of DataSets to its workers.

    EXPORT: batch the RDD and save it once as sequence files (through Spark's Hadoop I/O, under the
    master's ``export_directory``), train from the files. DIRECT: train from the RDD itself, persisted
    at the master's storage level. AUTO: DIRECT while the data's in-memory size (the DataSets' arrays,
    summed by the counting job every fit runs anyway) is within the master's
    ``direct_memory_budget_mb``, EXPORT above it. RDDs of paths (``fit_paths``) are never exported.
    """

    EXPORT = "export"
    DIRECT = "direct"
    AUTO = "auto"


class AveragingJobs(enum.Enum):
    """How ParameterAveragingTrainingMaster spreads its averaging rounds over Spark jobs.

    ONE: all rounds of a fit in one barrier job (one task per worker, started together); the workers
    average over the gradient-sharing transport (:mod:`sparkgrad.transport`) through a controller on the
    driver, so a round costs no Spark job. PER_ROUND: DL4J's way, a Spark job per round (broadcast,
    ``mapPartitions``, ``treeAggregate``): more workers than task slots are possible, and a failed task
    is re-run for its round instead of failing the fit.
    """

    ONE = "one"
    PER_ROUND = "per_round"


# PySpark always stores Python objects serialised, so DL4J's *_SER levels map onto the plain ones.
_STORAGE_ALIASES = {
    "MEMORY_ONLY_SER": "MEMORY_ONLY",
    "MEMORY_AND_DISK_SER": "MEMORY_AND_DISK",
    "MEMORY_ONLY_SER_2": "MEMORY_ONLY_2",
    "MEMORY_AND_DISK_SER_2": "MEMORY_AND_DISK_2",
}
_STORAGE_LEVELS = (
    "NONE",
    "DISK_ONLY",
    "DISK_ONLY_2",
    "DISK_ONLY_3",
    "MEMORY_AND_DISK",
    "MEMORY_AND_DISK_2",
    "MEMORY_AND_DISK_DESER",
    "MEMORY_ONLY",
    "MEMORY_ONLY_2",
    "OFF_HEAP",
    *_STORAGE_ALIASES,
)


def check_storage_level(field: str, value: Any) -> str:
    """Validate a storage-level name (case-insensitive); returns it upper-cased."""
    if not isinstance(value, str) or value.upper() not in _STORAGE_LEVELS:
        raise ValueError(f"{field}: expected one of {', '.join(_STORAGE_LEVELS)}, got {value!r}")
    return value.upper()


def storage_level(name: str) -> StorageLevel:
    """The pyspark StorageLevel of a validated name."""
    from pyspark import StorageLevel

    return getattr(StorageLevel, _STORAGE_ALIASES.get(name, name))


@dataclass
class VoidConfiguration(Config):
    """Where the gradient-sharing controller listens, and the secret that authenticates its frames.

    Args:
        unicast_port: controller TCP port on the driver; 0 (the default) takes a free port for each fit,
            which the workers learn from the fit's job (set one where a firewall must allow it; DL4J's
            default was 49876).
        controller_address: explicit controller address; else ``SPARKGRAD_VOID_IP``, else the local
            address inside ``network_mask``, else the driver host Spark reports.
        network_mask: CIDR string such as ``"10.0.0.0/8"`` selecting the driver interface to use.
        secret: the key that authenticates every gradient-sharing frame (HMAC-SHA256), as bytes or a
            hex string of at least 32 bytes, e.g. from your own key store. None (the default): every fit
            draws a fresh random 256-bit secret, which is the better choice unless you need to know the
            key. The secret is never serialised: ``to_dict``/``to_json``/``to_yaml`` leave it out and
            ``repr`` hides it, so a saved configuration holds no key (pass it again after loading).
            It is excluded from equality.
    """

    unicast_port: int = 0
    controller_address: str | None = None
    network_mask: str | None = None
    secret: bytes | str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.unicast_port = check_int("unicast_port", self.unicast_port, minimum=0, maximum=65535)
        if self.controller_address is not None and (
            not isinstance(self.controller_address, str) or not self.controller_address.strip()
        ):
            raise ValueError(
                f"controller_address: expected a host name or IP, got {self.controller_address!r}"
            )
        if self.network_mask is not None:
            if not isinstance(self.network_mask, str):
                raise ValueError(
                    f"network_mask: expected a CIDR string such as '10.0.0.0/8', got {self.network_mask!r}"
                )
            try:
                ipaddress.ip_network(self.network_mask, strict=False)
            except ValueError as exc:
                raise ValueError(f"network_mask: not a CIDR network ({exc})") from None
        if self.secret is not None:
            self.secret = _check_secret(self.secret)

    def to_dict(self) -> dict[str, Any]:
        """The serialisable mapping, without ``secret`` (a key never goes into a config file)."""
        out = super().to_dict()
        del out["secret"]
        return out

    def resolve_controller_address(self, spark_driver_host: str | None) -> str:
        """The address workers connect to (resolution order documented on the class).

        Args:
            spark_driver_host: ``spark.driver.host`` of the running SparkContext.

        Returns:
            An address string.
        """
        if self.controller_address:
            return self.controller_address
        env = os.environ.get("SPARKGRAD_VOID_IP")
        if env:
            return env
        if self.network_mask:
            found = address_in_network(self.network_mask)
            if found is None:
                raise ValueError(f"network_mask: no local interface address lies in {self.network_mask}")
            return found
        if spark_driver_host:
            return spark_driver_host
        return "127.0.0.1"


def _check_secret(value: Any) -> bytes:
    """A user secret as bytes: bytes, or a hex string; at least MIN_SECRET_BYTES long."""
    if isinstance(value, str):
        try:
            value = bytes.fromhex(value)
        except ValueError:
            raise ValueError("secret: a string secret must be hexadecimal") from None
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"secret: expected bytes or a hex string, got {type(value).__name__}")
    if len(value) < MIN_SECRET_BYTES:
        raise ValueError(
            f"secret: must hold at least {MIN_SECRET_BYTES} bytes ({8 * MIN_SECRET_BYTES} bits), "
            f"got {len(value)}"
        )
    return bytes(value)


def _interface_addresses() -> list[str]:
    """The IPv4 address of every network interface (Linux: SIOCGIFADDR per interface; empty elsewhere)."""
    try:
        import fcntl
        import struct

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError, AttributeError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                request = struct.pack("256s", name.encode()[:15])
                reply = fcntl.ioctl(s.fileno(), 0x8915, request)  # SIOCGIFADDR
            except OSError:  # no IPv4 address on this interface
                continue
            found.append(socket.inet_ntoa(reply[20:24]))
    return found


def _local_addresses() -> list[str]:
    found = {"127.0.0.1", *_interface_addresses()}
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    except OSError:
        pass
    try:  # the address of the default route, without sending anything
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            found.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(found)


def address_in_network(mask: str) -> str | None:
    """This machine's first IPv4 address inside the CIDR ``mask`` (None if there is none)."""
    net = ipaddress.ip_network(mask, strict=False)
    for addr in _local_addresses():
        if ipaddress.ip_address(addr) in net:
            return addr
    return None


@dataclass
class TrainingHook(Config):
    """Called on the worker around every minibatch update of parameter-averaging training.

    Subclass it as a dataclass so a master holding hooks still round-trips through JSON/YAML; hooks are
    pickled to the executors.
    """

    def pre_update(self, dataset: Any, network: Any) -> None:
        """Before the update of ``dataset`` is applied to ``network``."""

    def post_update(self, dataset: Any, network: Any) -> None:
        """After the update of ``dataset`` was applied to ``network``."""


__all__ = [
    "AveragingJobs",
    "DefaultRepartitioner",
    "EqualRepartitioner",
    "MeshBuildMode",
    "NoOpRepartitioner",
    "RDDTrainingApproach",
    "Repartition",
    "RepartitionStrategy",
    "Repartitioner",
    "TrainingHook",
    "VoidConfiguration",
    "address_in_network",
    "check_storage_level",
    "storage_level",
]
