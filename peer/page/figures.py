"""What the swarm page draws of one peer's ``/status`` (``figures``), checked field by field and
capped, whatever the peer sent; and where this daemon may fetch a peer's ``/status`` from
(``status_url``: a plain ``host:port``, no wider in scope than this daemon's own). Pure: no I/O."""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any

STATES = frozenset({"running", "idle", "finished", "failed", "serving"})
MAX_ROLES = 8  # roles of one peer drawn
MAX_SERIES = 8  # series of one role
MAX_POINTS = 512  # points of one series: the most recent
MAX_LEDGERS = 3  # ledgers of one role: the most recent
MAX_EXCHANGES = 8  # exchanges of one ledger
MAX_TEXT = 120  # characters of any text drawn
MAX_PROBLEMS = 8  # malformed fields named per peer
EXCHANGE_FIELDS = ("expected", "arrived", "used", "rejected", "timed_out")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
LOOPBACK, LINK_LOCAL, PRIVATE, GLOBAL = range(4)


def figures(status: Any) -> dict[str, Any]:
    """The page's figures of one peer: ``state``, ``bytes_sent``, ``bytes_received``, ``series``
    (``[{role, name, points}]``), ``ledgers`` (rows of text) and ``malformed`` (the fields that
    were not what a status holds, and were left out). Never raises, for any JSON value."""
    problems: list[str] = []
    if not isinstance(status, dict):
        return {**_empty(), "malformed": ["status"]}
    health = status.get("health")
    state = health.get("state") if isinstance(health, dict) else None
    if state not in STATES:
        problems.append("health")
        state = "?"
    out: dict[str, Any] = {**_empty(), "state": state}
    for key in ("bytes_sent", "bytes_received"):
        value = status.get(key)
        if _is_count(value):
            out[key] = value
        elif value is not None:
            problems.append(key)
    roles = status.get("role_status", {})
    if not isinstance(roles, dict):
        problems.append("role_status")
        roles = {}
    for role, role_status in list(roles.items())[:MAX_ROLES]:
        if not isinstance(role_status, dict):
            problems.append(f"role_status.{_text(role)}")
            continue
        out["series"] += _series(_text(role), role_status.get("series", {}), problems)
        out["ledgers"] += _ledgers(role_status.get("ledgers", []), problems, f"role_status.{_text(role)}")
    out["malformed"] = problems[:MAX_PROBLEMS]
    return out


def _empty() -> dict[str, Any]:
    return {"state": "?", "bytes_sent": None, "bytes_received": None, "series": [], "ledgers": [], "malformed": []}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, NaN, infinite, or too large)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        text = "a large number"
    elif value is None or isinstance(value, int | float):
        text = repr(value)
    else:
        text = f"a {type(value).__name__}"
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def _series(role: str, series: Any, problems: list[str]) -> list[dict[str, Any]]:
    if not isinstance(series, dict):
        problems.append(f"role_status.{role}.series")
        return []
    out = []
    for name, points in list(series.items())[:MAX_SERIES]:
        if not isinstance(points, list | tuple):
            problems.append(f"role_status.{role}.series.{_text(name)}")
            continue
        pairs = [[_finite(p[0]), _finite(p[1])] for p in points[-MAX_POINTS:]
                 if isinstance(p, list | tuple) and len(p) == 2]
        kept = [pair for pair in pairs if None not in pair]
        if len(kept) < min(len(points), MAX_POINTS):
            problems.append(f"role_status.{role}.series.{_text(name)}")
        if kept:
            out.append({"role": role, "name": _text(name), "points": kept})
    return out


def _ledgers(ledgers: Any, problems: list[str], where: str) -> list[list[str]]:
    if not isinstance(ledgers, list | tuple):
        problems.append(f"{where}.ledgers")
        return []
    rows = []
    for ledger in ledgers[-MAX_LEDGERS:]:
        if not isinstance(ledger, dict):
            problems.append(f"{where}.ledgers")
            continue
        at = " ".join(f"{key} {_text(ledger[key])}" for key in ("block", "round", "step", "version")
                      if key in ledger) or "-"
        for name, exchange in _exchanges(ledger)[:MAX_EXCHANGES]:
            rows.append([at, _text(name) or "-", *(_count(exchange.get(key)) for key in EXCHANGE_FIELDS)])
    return rows


def _exchanges(ledger: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
    """A ledger is an exchange itself (expected/arrived/...) or holds exchanges under named keys."""
    if "expected" in ledger and "arrived" in ledger:
        return [("", ledger)]
    return [(k, v) for k, v in ledger.items() if isinstance(v, dict) and "expected" in v and "arrived" in v]


def _count(value: Any) -> str:
    """A count as the page shows it: a number, a list's length, or a map's size and its entries."""
    if isinstance(value, list):
        return str(len(value))
    if isinstance(value, dict):
        entries = "; ".join(f"{_text(k)[:8]}: {_text(v)[:40]}" for k, v in list(value.items())[:4])
        return _text(f"{len(value)} ({entries})" if value else "0")
    return "-" if value is None else _text(value)


def address_scope(host: str) -> int:
    """How far an address reaches: LOOPBACK, LINK_LOCAL, PRIVATE or GLOBAL (a name counts as GLOBAL,
    "localhost" as LOOPBACK)."""
    if host.lower() == "localhost":
        return LOOPBACK
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return GLOBAL
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return LOOPBACK
    if address.is_link_local:
        return LINK_LOCAL
    return PRIVATE if address.is_private or address.is_unspecified else GLOBAL


def status_url(http_addr: Any, own_http_addr: str) -> str | None:
    """``http://host:port/status?view=public`` for a peer's announced address, or None: anything but
    an IP literal or a DNS name and a port (a path, a query, credentials, spaces), and an address
    narrower in scope than this daemon's own (a public daemon fetches no loopback, link-local or
    private address: a page viewer cannot make it probe its own host or network)."""
    host, port = _host_port(http_addr)
    if host is None:
        return None
    own_host, _ = _host_port(own_http_addr)
    if address_scope(host) < (address_scope(own_host) if own_host else GLOBAL):
        return None
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/status?view=public"


def _host_port(addr: Any) -> tuple[str | None, int]:
    if not isinstance(addr, str) or len(addr) > 300:
        return None, 0
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) <= 65535:
        return None, 0
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            return (host, int(port)) if ipaddress.ip_address(host).version == 6 else (None, 0)
        except ValueError:
            return None, 0
    try:
        return (host, int(port)) if ipaddress.ip_address(host).version == 4 else (None, 0)
    except ValueError:
        return (host, int(port)) if _HOSTNAME.match(host) and not host.replace(".", "").isdigit() else (None, 0)
