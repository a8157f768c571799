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

{{/* A Kubernetes quantity ("500m", "96", "384Gi", "6Ti") as a number of base units, for the
checks in validations.yaml (Helm has no quantity type). */}}
{{- define "gpufleet.qty" -}}
{{- $s := toString . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $s -}}
{{- $suffix := trimPrefix $num $s -}}
{{- $mult := dict "" 1.0 "m" 0.001 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 -}}
{{- if or (not $num) (not (hasKey $mult $suffix)) -}}
{{- fail (printf "%q is not a Kubernetes quantity (such as 500m, 96, 384Gi)" $s) -}}
{{- end -}}
{{- mulf (float64 $num) (get $mult $suffix) -}}
{{- end -}}

{{/* A number of base units of resource .r for a message: memory in Gi, others as they are. */}}
{{- define "gpufleet.human" -}}
{{- if eq .r "memory" -}}{{ printf "%gGi" (divf .n 1073741824.0) }}{{- else -}}{{ printf "%g" .n }}{{- end -}}
{{- end -}}
