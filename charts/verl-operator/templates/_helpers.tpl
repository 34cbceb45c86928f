{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "verl-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: release-chart, or the release name when it already holds the chart name. */}}
{{- define "verl-operator.fullname" -}}
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

{{- define "verl-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "verl-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "verl-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "verl-operator.labels" -}}
helm.sh/chart: {{ include "verl-operator.chart" . }}
{{ include "verl-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "verl-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "verl-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "verl-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Names of the webhook objects. */}}
{{- define "verl-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "verl-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "verl-operator.webhookSecretName" -}}
{{- if .Values.webhook.tls.existingSecret }}
{{- .Values.webhook.tls.existingSecret }}
{{- else }}
{{- printf "%s-webhook-tls" (include "verl-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The webhook server runs in the operator pod (not dev mode): it needs the certificate mounted. */}}
{{- define "verl-operator.webhookInCluster" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.url) }}true{{ end }}
{{- end }}

{{/* "true" when each operator pod runs the webhook relay in front of the replicas' webhook servers. */}}
{{- define "verl-operator.webhookRelay" -}}
{{- if and (include "verl-operator.webhookInCluster" .) .Values.webhook.relay.enabled }}true{{ end }}
{{- end }}

{{/* The headless Service whose ready addresses are the replicas' webhook servers (the relays' peers). */}}
{{- define "verl-operator.webhookBackendsName" -}}
{{- printf "%s-webhook-backends" (include "verl-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
A rule of a Role/ClusterRole: apiGroups, resources and verbs, minus the verbs in rbac.dropVerbs. A rule left
with no verbs is not rendered at all (the API server rejects an empty verb list).
Call with (dict "root" $ "groups" (list ...) "resources" (list ...) "verbs" (list ...)).
*/}}
{{- define "verl-operator.rule" -}}
{{- $verbs := list }}
{{- range .verbs }}
{{- if not (has . $.root.Values.rbac.dropVerbs) }}
{{- $verbs = append $verbs . }}
{{- end }}
{{- end }}
{{- if $verbs }}
- apiGroups: {{ toJson .groups }}
  resources: {{ toJson .resources }}
  verbs: {{ toJson $verbs }}
{{- end }}
{{- end }}

{{/*
The rules of the namespaced resources the operator reads and writes (a ClusterRole, or one Role per watched
namespace). They match the table "RBAC verbs the operator uses" in docs/operator.md.
*/}}
{{- define "verl-operator.namespacedRules" -}}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "verl-operator.io") "resources" (list "verljobs") "verbs" (list "get" "list" "watch" "patch" "delete")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "verl-operator.io") "resources" (list "verljobs/status") "verbs" (list "get" "patch")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "") "resources" (list "pods") "verbs" (list "get" "list" "watch" "create" "delete" "patch")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "") "resources" (list "configmaps") "verbs" (list "get" "list" "watch" "create" "patch" "delete")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "") "resources" (list "services") "verbs" (list "get" "list" "watch" "create" "delete")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "") "resources" (list "serviceaccounts") "verbs" (list "get" "create")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "") "resources" (list "resourcequotas" "limitranges") "verbs" (list "get" "list" "watch")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "" "events.k8s.io") "resources" (list "events") "verbs" (list "create" "patch")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "kueue.x-k8s.io") "resources" (list "workloads") "verbs" (list "get")) }}
{{- if .Values.rbac.volcano }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "scheduling.volcano.sh") "resources" (list "podgroups") "verbs" (list "get" "create" "delete")) }}
{{- end }}
{{- end }}

{{/*
The rules of cluster-scoped resources: always a ClusterRole. Nodes feed the placement index; kopf discovers the
VerlJob resource from its CRD. Namespaces: a change of one (its Pod Security labels) makes the webhook check
its next job afresh, and watching given namespaces kopf follows them.
*/}}
{{- define "verl-operator.clusterRules" -}}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "") "resources" (list "nodes") "verbs" (list "get" "list" "watch")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "apiextensions.k8s.io") "resources" (list "customresourcedefinitions") "verbs" (list "get" "list" "watch")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "scheduling.k8s.io") "resources" (list "priorityclasses") "verbs" (list "get" "list" "watch")) }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "") "resources" (list "namespaces") "verbs" (list "get" "list" "watch")) }}
{{- if and .Values.webhook.enabled .Values.policy.requirePodCreatePermission }}
{{- include "verl-operator.rule" (dict "root" . "groups" (list "authorization.k8s.io") "resources" (list "subjectaccessreviews") "verbs" (list "create")) }}
{{- end }}
{{- end }}

{{/*
The topology probe's objects. Its pods carry their own name label, so the operator's Services and Deployment
(which select name + instance) never pick them up.
*/}}
{{- define "verl-operator.probeName" -}}
{{- printf "%s-topology-probe" (include "verl-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "verl-operator.probeSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-topology-probe" (include "verl-operator.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "verl-operator.probeLabels" -}}
helm.sh/chart: {{ include "verl-operator.chart" . }}
{{ include "verl-operator.probeSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: topology-probe
{{- end }}

{{/* An image reference: repository:tag, or the repository alone when the tag is empty. */}}
{{- define "verl-operator.imageRef" -}}
{{- if .tag }}{{ printf "%s:%s" .repository .tag }}{{ else }}{{ .repository }}{{ end }}
{{- end }}

{{/*
The leader election's Lease: its name (the full name unless leaderElection.leaseName) and namespace (the
release namespace unless leaderElection.namespace).
*/}}
{{- define "verl-operator.leaseName" -}}
{{- default (include "verl-operator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "verl-operator.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace }}
{{- end }}
