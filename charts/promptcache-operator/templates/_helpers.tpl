{{/* Names and labels shared by every template of the chart. */}}

{{- define "promptcache-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name when it already contains the chart name (the common
`helm install promptcache-operator ...`), otherwise "<release>-<chart>". Truncated to 52
characters so suffixes such as "-metrics" stay inside the 63-character name limit.
*/}}
{{- define "promptcache-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "promptcache-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "promptcache-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "promptcache-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "promptcache-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: promptcache
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "promptcache-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "promptcache-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: a digest pins it; otherwise the tag, defaulting to appVersion. */}}
{{- define "promptcache-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}
