{{/*
Names, labels and selectors of everything the chart renders. Templates use these helpers only, never literal
label keys, so a name or label changes in one place (a test in tests/chart/test_helpers.py keeps it so).
*/}}

{{/* Chart name, truncated to the 63 characters of a label value. */}}
{{- define "eagle3-target.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, prefixed to the chart name unless it already contains it. */}}
{{- define "eagle3-target.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "eagle3-target.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object the chart renders; the component helpers below add app.kubernetes.io/component. */}}
{{- define "eagle3-target.labels" -}}
helm.sh/chart: {{ include "eagle3-target.chart" . }}
{{ include "eagle3-target.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: eagle3-target
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "eagle3-target.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eagle3-target.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* ---- precompute: the Indexed Job writing the offline cache ---- */}}
{{- define "eagle3-target.precompute.labels" -}}
{{ include "eagle3-target.labels" . }}
app.kubernetes.io/component: precompute
{{- end }}

{{- define "eagle3-target.precompute.selectorLabels" -}}
{{ include "eagle3-target.selectorLabels" . }}
app.kubernetes.io/component: precompute
{{- end }}

{{/* ---- operator: Deployment, ServiceAccount, RBAC ---- */}}
{{- define "eagle3-target.operator.fullname" -}}
{{- printf "%s-operator" (include "eagle3-target.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eagle3-target.operator.labels" -}}
{{ include "eagle3-target.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "eagle3-target.operator.selectorLabels" -}}
{{ include "eagle3-target.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "eagle3-target.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "eagle3-target.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "eagle3-target.operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{/* ---- target: the Eagle3Target and what selects its pods (PDB, NetworkPolicy, monitors, alerts) ---- */}}

{{/* The Eagle3Target's name; its pods are <name>-<ordinal>, its Services <name> and <name>-peers. */}}
{{- define "eagle3-target.targetName" -}}
{{- default (include "eagle3-target.fullname" .) .Values.target.name | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "eagle3-target.target.labels" -}}
{{ include "eagle3-target.labels" . }}
app.kubernetes.io/component: target
{{- end }}

{{/* The labels the operator puts on target pods and Services and selects pods by
(src/eagle3_target/operator/builders.py: selector). */}}
{{- define "eagle3-target.target.selectorLabels" -}}
eagle3.dev/target: {{ include "eagle3-target.targetName" . }}
app.kubernetes.io/component: target
{{- end }}

{{/* A PromQL matcher for the series scraped from this target's pods, whatever scrape config produced them. */}}
{{- define "eagle3-target.target.seriesSelector" -}}
namespace="{{ .Release.Namespace }}", pod=~"{{ include "eagle3-target.targetName" . }}-[0-9]+"
{{- end }}

{{- define "eagle3-target.target.image" -}}
{{- with .Values.target.image.repository }}
{{- printf "%s:%s" . (default $.Chart.AppVersion $.Values.target.image.tag) }}
{{- end }}
{{- end }}

{{/* The server image the operator runs for Eagle3Targets whose spec.image is empty. */}}
{{- define "eagle3-target.target.defaultImage" -}}
{{- include "eagle3-target.target.image" . | default (printf "ghcr.io/eagle3-target/eagle3-target:%s" .Chart.AppVersion) }}
{{- end }}

{{/* The Eagle3Target's image: its engine's own image where target.image.engineRepositories names one (an engine
whose pins clash with the hf image's), else the server image. */}}
{{- define "eagle3-target.engine.image" -}}
{{- with get (.Values.target.image.engineRepositories | default dict) .Values.target.engine }}
{{- printf "%s:%s" . (default $.Chart.AppVersion $.Values.target.image.tag) }}
{{- else }}
{{- include "eagle3-target.target.image" . }}
{{- end }}
{{- end }}

{{/* The HTTP port of replica i: with hostNetwork each replica has its own. Call with (list $ i). */}}
{{- define "eagle3-target.target.httpPort" -}}
{{- $root := index . 0 }}
{{- $ordinal := index . 1 }}
{{- if $root.Values.target.hostNetwork }}
{{- add $root.Values.target.ports.http $ordinal }}
{{- else }}
{{- $root.Values.target.ports.http }}
{{- end }}
{{- end }}

{{/* The cluster DNS name of a Service in the release namespace: (list $ service-name). */}}
{{- define "eagle3-target.serviceFQDN" -}}
{{- $root := index . 0 }}
{{- printf "%s.%s.svc.%s" (index . 1) $root.Release.Namespace $root.Values.clusterDomain }}
{{- end }}

{{/* ---- monitoring ---- */}}
{{- define "eagle3-target.monitoring.labels" -}}
{{ include "eagle3-target.labels" . }}
app.kubernetes.io/component: monitoring
{{- end }}

{{- define "eagle3-target.dashboard.fullname" -}}
{{- printf "%s-dashboard" (include "eagle3-target.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eagle3-target.monitorsEnabled" -}}
{{- if or .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled }}true{{ end }}
{{- end }}

{{/* ---- helm test ---- */}}
{{- define "eagle3-target.test.fullname" -}}
{{- printf "%s-test-fleet" (include "eagle3-target.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eagle3-target.test.labels" -}}
{{ include "eagle3-target.labels" . }}
app.kubernetes.io/component: test
{{- end }}
