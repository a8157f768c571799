{{/* Standard labels of every object the chart renders. */}}
{{- define "gpufleet.labels" -}}
app.kubernetes.io/name: gpufleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpufleet
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of a tenant's objects: call with (dict "root" $ "tenant" $tenant). */}}
{{- define "gpufleet.tenantLabels" -}}
{{ include "gpufleet.labels" .root }}
gpufleet.dev/tenant: {{ .tenant.name }}
{{- end }}

{{/* The ClusterQueue of a tenant. */}}
{{- define "gpufleet.clusterQueue" -}}
{{ .name }}
{{- end }}

{{/* A Kueue quota entry: name, nominalQuota and the optional limits. */}}
{{- define "gpufleet.quota" -}}
- name: {{ .resource }}
  nominalQuota: {{ .q.nominalQuota | quote }}
  {{- if hasKey .q "borrowingLimit" }}
  borrowingLimit: {{ .q.borrowingLimit | quote }}
  {{- end }}
  {{- if hasKey .q "lendingLimit" }}
  lendingLimit: {{ .q.lendingLimit | quote }}
  {{- end }}
{{- end }}
