"""`eagle3-target operator`: run the Eagle3Target operator (kopf). Imports no torch."""

from __future__ import annotations

import argparse
import importlib
import os

from ..exits import CommandError, Exit
from .config import OperatorConfig, package_default_image

# kopf's per-object lines (a handler succeeded, retried, failed) are the operator's own work log.
OWN_LOGGERS = ("kopf.objects",)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def _interval(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 would re-check without pause")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; exact names); default: all namespaces",
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
        default=os.environ.get("EAGLE3_TARGET_IMAGE") or package_default_image(),
        help="server image for targets whose spec.image is empty (env EAGLE3_TARGET_IMAGE; default %(default)s)",
    )
    p.add_argument(
        "--interval",
        type=_interval,  # argparse converts a string default too, so a bad environment value is a usage error
        default=os.environ.get("EAGLE3_TARGET_OPERATOR_INTERVAL", "10"),
        help="seconds between full re-checks of every target; events act at once (default 10)",
    )
    p.add_argument(
        "--stuck-pod-grace",
        type=_seconds,
        default=os.environ.get("EAGLE3_TARGET_OPERATOR_STUCK_POD_GRACE", "300"),
        help="seconds a pod may stay terminating past its deadline before a replacement starts under a new "
        "name (env EAGLE3_TARGET_OPERATOR_STUCK_POD_GRACE; default 300)",
    )
    p.add_argument(
        "--cluster-domain",
        default=os.environ.get("EAGLE3_TARGET_CLUSTER_DOMAIN") or "cluster.local",
        help="the cluster's DNS domain, which ends the names in each target's client ConfigMap "
        "(env EAGLE3_TARGET_CLUSTER_DOMAIN; default %(default)s)",
    )
    p.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        help="act without holding the Lease (development only: two operators would fight)",
    )
    p.add_argument(
        "--leader-election-namespace",
        default="",
        help="namespace of the Lease; default: the operator's own (its service account's, or the kubeconfig's)",
    )


def config_from(args: argparse.Namespace) -> OperatorConfig:
    return OperatorConfig(
        default_image=args.default_image,
        interval=args.interval,
        stuck_pod_grace=args.stuck_pod_grace,
        cluster_domain=args.cluster_domain,
        leader_election=args.leader_election,
        lease_namespace=args.leader_election_namespace,
    )


def check_credentials() -> None:
    """kopf retries a login that has no credentials every minute, forever: say so once, before starting."""
    from .incluster import SERVICE_ACCOUNT, api_server

    kubeconfigs = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    in_pod = api_server() is not None and (SERVICE_ACCOUNT / "token").is_file()
    if not in_pod and not any(os.path.isfile(p) for p in kubeconfigs.split(os.pathsep) if p):
        raise CommandError(
            f"no cluster credentials: no ServiceAccount token in {SERVICE_ACCOUNT} and no kubeconfig at "
            f"{kubeconfigs} (set $KUBECONFIG)",
            Exit.USAGE,
        )


def run(args: argparse.Namespace) -> int:
    import kopf

    check_credentials()
    config = config_from(args)
    importlib.import_module("eagle3_target.operator.handlers")
    try:
        kopf.run(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness or None,
            standalone=True,  # the Lease elects the one that acts; kopf's own peering would need two more CRDs
            memo=kopf.Memo(config=config),
        )
    except Exception as exc:
        # a startup handler's deliberate refusal (the CRD not served) comes wrapped in kopf's private
        # ActivityError: one line and exit 1, not kopf's traceback
        if isinstance(exc.__cause__, kopf.PermanentError):
            raise CommandError(str(exc.__cause__)) from None
        raise
    return 0
