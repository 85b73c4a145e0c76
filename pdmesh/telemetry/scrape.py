"""Read a service's /metrics as numbers: what tests, benches and scripts check a run by.

Parsed with prometheus_client's own parser, so a sample reads as the service exported it.
"""

from __future__ import annotations

import urllib.request

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(sample name, sorted labels) -> value."""


def scrape(address: str, timeout: float = 5.0) -> Samples:
    """Every sample of ``http://address/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == val for k, val in labels.items()))
