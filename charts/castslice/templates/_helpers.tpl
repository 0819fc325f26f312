{{/* The labels kustomize gives every object (app.kubernetes.io/part-of), and Helm's own. */}}
{{- define "castslice.labels" -}}
app.kubernetes.io/part-of: castslice
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "castslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The configuration file: .Values.config, with CAST AI's staticConfig as its spot section, HAMi's
chart values as its vgpu section, and the release namespace as the first excluded namespace
(the webhook's own). Rendered once here, read by the ConfigMap and the webhook's namespaceSelector.
*/}}
{{- define "castslice.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.staticConfig -}}
{{- $static := deepCopy .Values.staticConfig -}}
{{- if hasKey $static "IgnorePodsWithNodeSelectorsAffinities" -}}
{{- $_ := set $static "ignorePodsWithNodeSelectorsAffinities" (get $static "IgnorePodsWithNodeSelectorsAffinities") -}}
{{- $_ := unset $static "IgnorePodsWithNodeSelectorsAffinities" -}}
{{- end -}}
{{- $_ := set $config "spot" (mustMergeOverwrite (dict "enabled" true) (default dict $config.spot) $static) -}}
{{- end -}}
{{- $vgpu := deepCopy (default dict $config.vgpu) -}}
{{- $device := deepCopy (first (default (list dict) $vgpu.devices)) -}}
{{- $hami := false -}}
{{- range $value, $key := dict "resourceName" "countResource" "resourceMem" "memoryResource" "resourceMemPercentage" "memoryPercentageResource" "resourceCores" "coresResource" "resourcePriority" "priorityResource" -}}
{{- with get $.Values $value -}}
{{- $_ := set $device $key . -}}
{{- $hami = true -}}
{{- end -}}
{{- end -}}
{{- with .Values.schedulerName -}}
{{- $_ := set $vgpu "schedulerName" . -}}
{{- $hami = true -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.scheduler.forceOverwriteDefaultScheduler) -}}
{{- $_ := set $vgpu "forceOverwriteDefaultScheduler" .Values.scheduler.forceOverwriteDefaultScheduler -}}
{{- $hami = true -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.scheduler.defaultGPUNum) -}}
{{- $_ := set $vgpu "defaultCount" .Values.scheduler.defaultGPUNum -}}
{{- $hami = true -}}
{{- end -}}
{{- if $hami -}}
{{- $_ := set $vgpu "enabled" true -}}
{{- $_ := set $vgpu "devices" (prepend (rest (default (list dict) $vgpu.devices)) $device) -}}
{{- $_ := set $config "vgpu" $vgpu -}}
{{- end -}}
{{- $_ := set $config "excludedNamespaces" (prepend (rest $config.excludedNamespaces) .Release.Namespace) -}}
{{- toYaml $config -}}
{{- end }}
