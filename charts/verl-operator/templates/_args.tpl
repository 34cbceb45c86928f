{{/*
The operator's command line: `verl-operator run` with the watch scope, the probe, metrics and webhook server
settings. The webhook configuration object is owned by the chart, so the operator does not manage it.
*/}}
{{- define "verl-operator.args" -}}
- verl-operator
- run
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- {{ printf "--namespace=%s" . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- /* In a pod the kubelet probes and the API server calls the pod IP, so listen on every address. */}}
- --listen-address=0.0.0.0
- --health-port={{ .Values.health.port }}
{{- if .Values.metrics.enabled }}
- --metrics-port={{ .Values.metrics.port }}
{{- end }}
{{- if (include "verl-operator.webhookInCluster" .) }}
- --webhook-port={{ .Values.webhook.port }}
- --webhook-cert=/etc/verl-operator/webhook/tls.crt
- --webhook-key=/etc/verl-operator/webhook/tls.key
{{- end }}
{{- if .Values.webhook.enabled }}
- --policy-file=/etc/verl-operator/policy/policy.yaml
{{- end }}
{{- /* Only the holder of the Lease reconciles; every replica serves the webhook. */}}
{{- if .Values.leaderElection.enabled }}
{{- $le := .Values.leaderElection }}
{{- if ge (float64 $le.renewDeadline) (float64 $le.leaseDuration) }}
{{- fail (printf "leaderElection.renewDeadline (%v) must be less than leaderElection.leaseDuration (%v): a leader must stop before a standby can take over" $le.renewDeadline $le.leaseDuration) }}
{{- end }}
{{- if le (float64 $le.renewDeadline) (mulf 1.2 (float64 $le.retryPeriod)) }}
{{- fail (printf "leaderElection.renewDeadline (%v) must be greater than 1.2 x leaderElection.retryPeriod (%v): at least one renew must fit in the deadline" $le.renewDeadline $le.retryPeriod) }}
{{- end }}
- --leader-elect
- {{ printf "--leader-election-id=%s" (include "verl-operator.leaseName" .) | quote }}
- {{ printf "--leader-election-namespace=%s" (include "verl-operator.leaseNamespace" .) | quote }}
- {{ printf "--leader-election-lease-duration=%v" .Values.leaderElection.leaseDuration | quote }}
- {{ printf "--leader-election-renew-deadline=%v" .Values.leaderElection.renewDeadline | quote }}
- {{ printf "--leader-election-retry-period=%v" .Values.leaderElection.retryPeriod | quote }}
{{- end }}
{{- /* Ray pods of jobs with `verl.launcher: inject` copy the launcher from this same image. */}}
- {{ printf "--launcher-image=%s" (include "verl-operator.image" .) | quote }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
