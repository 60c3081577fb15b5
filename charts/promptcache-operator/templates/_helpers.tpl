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
app.kubernetes.io/instance: {{ .Release.Name | quote }}
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

{{/*
An image reference from {registry, repository, tag, digest} (called with
(dict "image" ... "root" $)): the registry defaults to image.registry, a digest pins the
image, otherwise the tag, defaulting to appVersion. A repository that starts with a
registry host (a first segment with "." or ":", or localhost) is used as it is.
*/}}
{{- define "promptcache-operator.imageRef" -}}
{{- $registry := default .root.Values.image.registry .image.registry | trimSuffix "/" }}
{{- $host := first (splitList "/" .image.repository) }}
{{- $name := printf "%s/%s" $registry .image.repository }}
{{- if and (contains "/" .image.repository) (or (contains "." $host) (contains ":" $host) (eq $host "localhost")) }}
{{- $name = .image.repository }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" $name .image.digest }}
{{- else }}
{{- printf "%s:%s" $name (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{- define "promptcache-operator.image" -}}
{{- include "promptcache-operator.imageRef" (dict "image" .Values.image "root" .) }}
{{- end }}

{{/* Default images of the resources: the front's, and the gateway policy step's (the operator image unless set). */}}
{{- define "promptcache-operator.frontImage" -}}
{{- include "promptcache-operator.imageRef" (dict "image" .Values.defaultImages.front "root" .) }}
{{- end }}

{{- define "promptcache-operator.gatewayPolicyImage" -}}
{{- if .Values.defaultImages.gatewayPolicy.repository }}
{{- include "promptcache-operator.imageRef" (dict "image" .Values.defaultImages.gatewayPolicy "root" .) }}
{{- else }}
{{- include "promptcache-operator.image" . }}
{{- end }}
{{- end }}

{{/*
The operator's RBAC rules: the one file owned with the operator's code. Everything RBAC in
this chart is this list or a subset of it selected by resource, never a rule of its own.
*/}}
{{- define "promptcache-operator.rules" -}}
{{- $rules := .Files.Get "files/clusterrole-rules.yaml" }}
{{- if not $rules }}
{{- fail "files/clusterrole-rules.yaml is missing from the chart: it holds the operator's RBAC rules" }}
{{- end }}
{{- $rules | replace "ENDPOINT_PICKER_CLUSTER_ROLE" (include "promptcache-operator.pickerRole" .) }}
{{- end }}

{{/* The static ClusterRole every Endpoint Picker is bound to, per namespace, by the operator. */}}
{{- define "promptcache-operator.pickerRole" -}}
{{- printf "%s-endpoint-picker" (include "promptcache-operator.fullname" .) }}
{{- end }}

{{/* A rules file of the chart by name; failing names the missing file. */}}
{{- define "promptcache-operator.file" -}}
{{- $text := .root.Files.Get (printf "files/%s" .name) }}
{{- if not $text }}
{{- fail (printf "files/%s is missing from the chart" .name) }}
{{- end }}
{{- $text }}
{{- end }}

{{/*
Rules from the file on cluster-scoped resources (e.g. nodes). A RoleBinding cannot grant
those, so a namespaced install binds just these cluster-wide. The list names Kubernetes'
cluster-scoped built-in resources; it holds no verbs and grants nothing by itself.
*/}}
{{- define "promptcache-operator.clusterScopedRules" -}}
{{- $scoped := list "nodes" "namespaces" "persistentvolumes" "storageclasses" "csinodes" "csidrivers" "volumeattachments" "runtimeclasses" "priorityclasses" "ingressclasses" "gatewayclasses" "customresourcedefinitions" "apiservices" "clusterroles" "clusterrolebindings" "mutatingwebhookconfigurations" "validatingwebhookconfigurations" "validatingadmissionpolicies" "validatingadmissionpolicybindings" "certificatesigningrequests" "tokenreviews" "subjectaccessreviews" "selfsubjectaccessreviews" "selfsubjectrulesreviews" "clusterkopfpeerings" }}
{{- $out := list }}
{{- range (include "promptcache-operator.rules" . | fromYamlArray) }}
{{- if .nonResourceURLs }}
{{- $out = append $out . }}
{{- else }}
{{- $resources := list }}
{{- range .resources }}{{ if has (first (splitList "/" .)) $scoped }}{{ $resources = append $resources . }}{{ end }}{{ end }}
{{- if $resources }}
{{- $rule := dict "apiGroups" .apiGroups "resources" $resources "verbs" .verbs }}
{{- if .resourceNames }}{{ $_ := set $rule "resourceNames" .resourceNames }}{{ end }}
{{- $out = append $out $rule }}
{{- end }}
{{- end }}
{{- end }}
{{- if $out }}{{ toYaml $out }}{{ end }}
{{- end }}

{{/* The body-based router's name and labels (templates/body-based-router.yaml). */}}
{{- define "promptcache-operator.bbrName" -}}
{{- printf "%s-bbr" (include "promptcache-operator.fullname" .) }}
{{- end }}

{{/* Its own app.kubernetes.io/name: the operator's Service and Deployment select by name and instance. */}}
{{- define "promptcache-operator.bbrSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-bbr" (include "promptcache-operator.name" .) }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: body-based-router
{{- end }}

{{- define "promptcache-operator.bbrLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "promptcache-operator.bbrSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: promptcache
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The model-list responder's labels (templates/model-list.yaml). */}}
{{- define "promptcache-operator.modelListSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-models" (include "promptcache-operator.name" .) }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: model-list
{{- end }}

{{- define "promptcache-operator.modelListLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "promptcache-operator.modelListSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: promptcache
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
