"""`eagle3-target operator`: run the Eagle3Target operator (kopf). Imports no torch."""

from __future__ import annotations

import argparse
import importlib
import os


def add_arguments(p: argparse.ArgumentParser) -> None:
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; globs allowed); default: all namespaces",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    p.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf's liveness endpoint URL, '' to disable (default %(default)s)",
    )
    p.add_argument(
        "--default-image",
        default=os.environ.get("EAGLE3_TARGET_IMAGE"),
        help="server image for targets whose spec.image is empty (env EAGLE3_TARGET_IMAGE)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=float(os.environ.get("EAGLE3_TARGET_OPERATOR_INTERVAL", 10)),
        help="seconds between re-checks of each target: healing and status (default 10)",
    )


def run(args: argparse.Namespace) -> int:
    import kopf

    # the timer interval is fixed when the handlers register, so it travels by environment
    os.environ["EAGLE3_TARGET_OPERATOR_INTERVAL"] = str(args.interval)
    if args.default_image:
        os.environ["EAGLE3_TARGET_IMAGE"] = args.default_image
    importlib.import_module("eagle3_target.operator.handlers")
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        standalone=True,  # one replica with a Recreate strategy: no peering objects needed
    )
    return 0
