{{/* The operator's namespaced permissions; keep in step with manifests/rbac.yaml. */}}
{{- define "eagle3-target.operator.rules" -}}
- apiGroups: [eagle3.dev]
  resources: [eagle3targets]
  verbs: [get, list, watch, patch, update]
- apiGroups: [eagle3.dev]
  resources: [eagle3targets/status]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
