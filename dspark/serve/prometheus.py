"""Counters, gauges and histograms rendered in the Prometheus text format (0.0.4).

Small on purpose: no registry of collectors, no multiprocess mode. Every family
carries the same constant labels (the served model name), updates are guarded by
one lock per family, and `render` writes HELP/TYPE lines followed by the samples.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

LabelValues = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


def _number(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == int(x) and abs(x) < 2**53:
        return str(int(x))
    return repr(float(x))


class _Family:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: tuple[str, ...] = (),
                 const_labels: dict[str, str] | None = None) -> None:
        self.name = name
        self.help = help
        self.labelnames = labelnames
        self.const = tuple((const_labels or {}).items())
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, object]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def _label_str(self, key: LabelValues, extra: tuple[tuple[str, str], ...] = ()) -> str:
        return _labels(self.const + tuple(zip(self.labelnames, key)) + extra)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        with self._lock:
            lines += self._samples()
        return lines

    def _samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Family):
    """A monotonically increasing total; the name should end in `_total`."""

    kind = "counter"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._values: dict[LabelValues, float] = {} if self.labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease (got {amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: object) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def _samples(self) -> list[str]:
        return [f"{self.name}{self._label_str(k)} {_number(v)}" for k, v in sorted(self._values.items())]


class Gauge(_Family):
    """A value that goes up and down; with label names, one value per label set."""

    kind = "gauge"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._values: dict[LabelValues, float] = {} if self.labelnames else {(): 0.0}

    def set(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def value(self, **labels: object) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def _samples(self) -> list[str]:
        return [f"{self.name}{self._label_str(k)} {_number(v)}" for k, v in sorted(self._values.items())]


class Histogram(_Family):
    """Cumulative buckets (`le`), `_sum` and `_count`, as Prometheus expects."""

    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Iterable[float],
                 const_labels: dict[str, str] | None = None) -> None:
        super().__init__(name, help, (), const_labels)
        self.bounds = sorted(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self._sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """Record `value` `count` times."""
        i = next((j for j, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        with self._lock:
            self._counts[i] += count
            self._sum += value * count

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts)

    def _samples(self) -> list[str]:
        lines, cumulative = [], 0
        for bound, n in zip([*self.bounds, math.inf], self._counts):
            cumulative += n
            lines.append(f"{self.name}_bucket{self._label_str((), (('le', _number(bound)),))} {cumulative}")
        lines.append(f"{self.name}_sum{self._label_str(())} {_number(self._sum)}")
        lines.append(f"{self.name}_count{self._label_str(())} {cumulative}")
        return lines


def render(families: Iterable[_Family]) -> str:
    return "\n".join(line for f in families for line in f.render()) + "\n"
