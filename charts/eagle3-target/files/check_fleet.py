"""helm test: every target answers /health with 200 and reports eagle3_target_ready 1 on /metrics.

Standard library only, so any image with python3 runs it. Input (environment):
  TARGET_URLS  space-separated base URLs, one per replica (per-pod DNS names under <name>-peers)
  SERVICE_URL  optional base URL through the trainer-facing Service <name> (its A records)
  DEADLINE_S   how long to keep retrying one URL (DNS reaches clients with a delay), default 60
"""

import os
import sys
import time
import urllib.error
import urllib.request


def fetch(url: str, deadline_s: float) -> tuple[int, str]:
    """GET with retries until deadline_s; status 0 and the error text when nothing answered."""
    end = time.monotonic() + deadline_s
    delay = 0.5
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read().decode("utf-8", "replace")
            if time.monotonic() >= end:
                return status, body
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() >= end:
                return 0, f"{type(exc).__name__}: {exc}"
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def ready_from_metrics(text: str) -> bool:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "eagle3_target_ready":
            return float(value) == 1.0
    return False


def check(base: str, deadline_s: float) -> list[str]:
    problems = []
    status, body = fetch(base + "/health", deadline_s)
    if status != 200:
        problems.append(f"{base}/health answered {status}: {body[:200]}")
    status, body = fetch(base + "/metrics", deadline_s)
    if status != 200:
        problems.append(f"{base}/metrics answered {status}")
    elif not ready_from_metrics(body):
        problems.append(f"{base}/metrics does not report eagle3_target_ready 1")
    return problems


def main() -> int:
    urls = os.environ.get("TARGET_URLS", "").split()
    if os.environ.get("SERVICE_URL"):
        urls.append(os.environ["SERVICE_URL"])
    if not urls:
        print("FAIL: no TARGET_URLS given")
        return 1
    deadline_s = float(os.environ.get("DEADLINE_S", "60"))
    problems = []
    for base in urls:
        found = check(base.rstrip("/"), deadline_s)
        print(("FAIL " if found else "ok   ") + base)
        problems += found
    for problem in problems:
        print("FAIL", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
