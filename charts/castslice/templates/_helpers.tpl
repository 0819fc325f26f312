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
{{- if .Values.gpuLeases.enabled -}}
{{- $_ := set $config "gpuLeases" (mustMergeOverwrite (default dict $config.gpuLeases) (dict "enabled" true)) -}}
{{- end -}}
{{- $_ := set $config "excludedNamespaces" (prepend (rest $config.excludedNamespaces) .Release.Namespace) -}}
{{- toYaml $config -}}
{{- end }}

{{/*
One file of a kustomize component (files/<component>/<file>: a copy of knative/components/,
byte for byte, which tests/deploy/test_helm_chart.py holds equal), rendered as components/settings
and the deployment overlay render it: the labels, the release namespace on namespaced objects and
on ServiceAccount subjects, the image, the release namespace where settings writes it (the
controller's identity in the lease policies, the Service name the monitoring checks), validating
webhooks calling the Service, and cert-manager's CA annotation only with cert-manager.
Called as (list $ "files/<component>/<file>").
*/}}
{{- define "castslice.component" -}}
{{- $root := index . 0 -}}
{{- $namespace := $root.Release.Namespace -}}
{{- $namespaced := list "ServiceAccount" "Role" "RoleBinding" "Deployment" "ConfigMap" "Service" "Job" "PodMonitor" "PrometheusRule" -}}
{{- $labels := include "castslice.labels" $root | fromYaml -}}
{{- $text := $root.Files.Get (index . 1) | replace "set-by-components-settings" $namespace -}}
{{- range $document := regexSplit "(?m)^---[ \t]*$" $text -1 }}
{{- $obj := fromYaml $document }}
{{- if $obj.kind }}
{{- $metadata := $obj.metadata }}
{{- $_ := set $metadata "labels" (mustMerge (default dict $metadata.labels) $labels) }}
{{- if has $obj.kind $namespaced }}
{{- $_ := set $metadata "namespace" $namespace }}
{{- end }}
{{- range $subject := default list $obj.subjects }}
{{- if eq $subject.kind "ServiceAccount" }}
{{- $_ := set $subject "namespace" $namespace }}
{{- end }}
{{- end }}
{{- if eq $obj.kind "Deployment" }}
{{- range $container := $obj.spec.template.spec.containers }}
{{- $_ := set $container "image" (include "castslice.image" $root) }}
{{- if ne $root.Values.image.pullPolicy "IfNotPresent" }}
{{- $_ := set $container "imagePullPolicy" $root.Values.image.pullPolicy }}
{{- end }}
{{- end }}
{{- $annotations := default dict $obj.spec.template.metadata.annotations }}
{{- $_ := set $annotations "checksum/config" (include "castslice.config" $root | sha256sum) }}
{{- $_ := set $obj.spec.template.metadata "annotations" $annotations }}
{{- end }}
{{- if eq $obj.kind "ValidatingWebhookConfiguration" }}
{{- range $hook := $obj.webhooks }}
{{- $path := regexReplaceAll "^https://[^/]*" $hook.clientConfig.url "" }}
{{- $_ := set $hook "clientConfig" (dict "service" (dict "name" "castslice" "namespace" $namespace "path" $path "port" 443)) }}
{{- end }}
{{- if $root.Values.certManager.enabled }}
{{- $_ := set $metadata "annotations" (dict "cert-manager.io/inject-ca-from" (printf "%s/castslice-serving-cert" $namespace)) }}
{{- else }}
{{- $_ := unset $metadata "annotations" }}
{{- end }}
{{- end }}
{{- if and (eq $obj.kind "CustomResourceDefinition") $root.Values.crds.keep }}
{{- $_ := set $metadata "annotations" (mustMerge (default dict $metadata.annotations) (dict "helm.sh/resource-policy" "keep")) }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}
