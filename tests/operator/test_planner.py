"""The planner's pure functions: pods read from the API, and which pods to create or delete next."""

from __future__ import annotations
