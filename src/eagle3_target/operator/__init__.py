"""The Eagle3Target operator: pure builders (spec, children, status) and the kopf handlers that apply them."""

GROUP = "eagle3.dev"
VERSION = "v1alpha1"
PLURAL = "eagle3targets"
KIND = "Eagle3Target"
