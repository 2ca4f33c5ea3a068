{{/* The operator's namespaced permissions: the same rules as manifests/rbac.yaml (a test compares them). */}}
{{- define "eagle3-target.operator.rules" -}}
- apiGroups: [eagle3.dev]
  resources: [eagle3targets]
  verbs: [list, watch, patch]
- apiGroups: [eagle3.dev]
  resources: [eagle3targets/status]
  verbs: [patch]
# children carry blockOwnerDeletion, which OwnerReferencesPermissionEnforcement allows only to
# those who may update the owner's finalizers
- apiGroups: [eagle3.dev]
  resources: [eagle3targets/finalizers]
  verbs: [update]
# patch: the weights version a pod serves (an annotation, after an in-place refresh)
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete, patch]
# the readiness gate that lets a new pod join the endpoints once it serves spec.weights
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
# the admin token Secret <name>-admin, created once and read back (no list or watch: no other Secret is read)
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# the operator's own children, read from its watches (its labels select them), created and repaired
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch, delete]
# list: a pod stuck creating its containers waits on a volume whose Secret, ConfigMap or claim is missing,
# which only its FailedMount Events say
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
# whether a target's namespace is being deleted (nothing can be created there); a Role in a watched namespace
# grants get on that namespace itself
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
{{- end }}

{{/* Cluster-scoped and read-only: which nodes are Ready, to replace pods on dead ones (manifests/rbac.yaml too). */}}
{{- define "eagle3-target.operator.nodeRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
{{- end }}
