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

{{/* Labels of every object the chart renders. */}}
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

{{/* The operator's Deployment, ServiceAccount and RBAC objects. */}}
{{- define "eagle3-target.operator.fullname" -}}
{{- printf "%s-operator" (include "eagle3-target.fullname" .) | trunc 63 | trimSuffix "-" }}
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

{{/* The Eagle3Target's name; its pods are <name>-<ordinal>, its Services <name> and <name>-peers. */}}
{{- define "eagle3-target.targetName" -}}
{{- default (include "eagle3-target.fullname" .) .Values.target.name | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "eagle3-target.target.image" -}}
{{- with .Values.target.image.repository }}
{{- printf "%s:%s" . (default $.Chart.AppVersion $.Values.target.image.tag) }}
{{- end }}
{{- end }}

{{/* The labels the operator puts on target pods and selects them by (operator/eagle3_target/operator/builders.py). */}}
{{- define "eagle3-target.target.podSelector" -}}
eagle3.dev/target: {{ include "eagle3-target.targetName" . }}
app.kubernetes.io/component: target
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

{{- define "eagle3-target.monitorsEnabled" -}}
{{- if or .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled }}true{{ end }}
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
