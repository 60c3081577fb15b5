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

{{/* The image reference: a digest pins it; otherwise the tag, defaulting to appVersion. */}}
{{- define "promptcache-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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
{{- $rules }}
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

{{/* Rules from the file on coordination.k8s.io Leases: the leader Lease in the release namespace. */}}
{{- define "promptcache-operator.leaseRules" -}}
{{- $out := list }}
{{- range (include "promptcache-operator.rules" . | fromYamlArray) }}
{{- if and (has "coordination.k8s.io" (.apiGroups | default list)) (has "leases" (.resources | default list)) }}
{{- $out = append $out (dict "apiGroups" (list "coordination.k8s.io") "resources" (list "leases") "verbs" .verbs) }}
{{- end }}
{{- end }}
{{- if not $out }}
{{- fail "files/clusterrole-rules.yaml grants nothing on coordination.k8s.io leases: the operator's leader election needs them" }}
{{- end }}
{{- toYaml $out }}
{{- end }}
