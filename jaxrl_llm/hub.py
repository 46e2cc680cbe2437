"""Whether a `jaxrl-llm` process may use the Hugging Face Hub: the CLI's decision, never an import's.

The package never changes the HF_* environment of a process that imports it. `jaxrl-llm` (cli.main) calls
`offline_unless_reachable()` once, first: when the user set none of HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE,
HF_DATASETS_OFFLINE, it asks the Hub endpoint (HF_ENDPOINT, else https://huggingface.co) for an answer within
PROBE_TIMEOUT_S, and only when none comes sets HF_HUB_OFFLINE=1 for this process, so `datasets` and
`transformers` read their local caches at once instead of retrying the network. A machine with a network
(and a Hub cache) uses the Hub as usual. Set HF_HUB_OFFLINE=1 (or 0) yourself to skip the probe.
"""

from __future__ import annotations

import os
import sys
import threading
import urllib.error
import urllib.request
from typing import MutableMapping

OFFLINE_KEYS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 1.5


def reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether `url` answers an HTTP request (any status) within `timeout_s`. The request runs in a daemon thread
    that is abandoned at the deadline: a name lookup with no DNS server can block past urlopen's own timeout."""
    answered = threading.Event()

    def probe():
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
                pass
            answered.set()
        except urllib.error.HTTPError:  # a status code is an answer
            answered.set()
        except (OSError, ValueError):  # no route, refused, timed out, a malformed HF_ENDPOINT
            pass

    thread = threading.Thread(target=probe, daemon=True, name="hub-probe")
    thread.start()
    thread.join(timeout_s)
    return answered.is_set()


def offline_unless_reachable(environ: MutableMapping[str, str] = os.environ, timeout_s: float = PROBE_TIMEOUT_S,
                             log=lambda m: print(m, file=sys.stderr)) -> bool:
    """Sets HF_HUB_OFFLINE=1 in `environ` when the user chose nothing and the Hub does not answer; True when it
    did. Call it before `huggingface_hub`, `datasets` or `transformers` is imported: they read it at import."""
    if any(key in environ for key in OFFLINE_KEYS):
        return False
    endpoint = environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    if reachable(endpoint, timeout_s):
        return False
    environ["HF_HUB_OFFLINE"] = "1"
    log(f"jaxrl-llm: {endpoint} did not answer within {timeout_s:g} s: Hugging Face offline mode for this run "
        f"(local files and the Hub cache only; set HF_HUB_OFFLINE=0 or 1 to choose yourself)")
    return True
