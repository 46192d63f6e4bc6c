{{/*
The chart's name, truncated to the 63 characters a DNS label allows.
*/}}
{{- define "asgi-admission.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified app name, truncated to 63 characters. A release name that already
contains the chart name is used as it is.
*/}}
{{- define "asgi-admission.fullname" -}}
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

{{/*
A name derived from the full name with a suffix, still within 63 characters.
Usage: include "asgi-admission.suffixedName" (list . "dashboard")
*/}}
{{- define "asgi-admission.suffixedName" -}}
{{- $ctx := index . 0 }}
{{- $fullname := include "asgi-admission.fullname" $ctx }}
{{- printf "%s-%s" ($fullname | trunc (int (sub 62 (len (index . 1)))) | trimSuffix "-") (index . 1) | trimSuffix "-" }}
{{- end }}

{{/*
Chart name and version, as used by the helm.sh/chart label.
*/}}
{{- define "asgi-admission.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels shared by every object of the release, the helm test pod included.
*/}}
{{- define "asgi-admission.commonLabels" -}}
helm.sh/chart: {{ include "asgi-admission.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "asgi-admission.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: {{ include "asgi-admission.name" . }}
{{- end }}

{{/*
Labels of the service and everything that belongs to it.
*/}}
{{- define "asgi-admission.labels" -}}
{{ include "asgi-admission.commonLabels" . }}
app.kubernetes.io/name: {{ include "asgi-admission.name" . }}
app.kubernetes.io/component: server
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels: name and instance only. helm.sh/chart and the version change on every
upgrade, and a Deployment's selector is immutable, so they are kept out.
*/}}
{{- define "asgi-admission.selectorLabels" -}}
app.kubernetes.io/name: {{ include "asgi-admission.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The service account's name.
*/}}
{{- define "asgi-admission.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "asgi-admission.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image tag: the value, or the chart's appVersion.
*/}}
{{- define "asgi-admission.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion | toString }}
{{- end }}

{{/*
The image reference, with the digest when one is given.
*/}}
{{- define "asgi-admission.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "asgi-admission.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
The name of the container and Service port that serves /metrics: the separate metrics
port when one is set, otherwise the application port.
*/}}
{{- define "asgi-admission.metricsPortName" -}}
{{- if .Values.metrics.port }}metrics{{ else }}http{{ end }}
{{- end }}

{{/*
The Service port number that serves /metrics.
*/}}
{{- define "asgi-admission.metricsServicePort" -}}
{{- if .Values.metrics.port }}{{ .Values.metrics.port }}{{ else }}{{ .Values.service.port }}{{ end }}
{{- end }}

{{/*
The liveness probe: livenessProbe, with its httpGet.path replaced by admission.livenessPath
when that is set (the path that fails while the pod's pressure is stuck). Empty when
livenessProbe is null.
*/}}
{{- define "asgi-admission.livenessProbe" -}}
{{- with .Values.livenessProbe }}
{{- $probe := deepCopy . }}
{{- if and $.Values.admission.livenessPath $probe.httpGet }}
{{- $_ := set $probe.httpGet "path" $.Values.admission.livenessPath }}
{{- end }}
{{- toYaml $probe }}
{{- end }}
{{- end }}

{{/*
A PromQL label selector for this release's pods, for autoscaling queries. A Deployment
names its pods <name>-<template hash>-<suffix>; anchoring both segments keeps a release
whose name is a prefix of another's from counting the other's pods.
*/}}
{{- define "asgi-admission.podSelectorPromQL" -}}
namespace="{{ .Release.Namespace }}",pod=~"{{ include "asgi-admission.fullname" . }}-[a-z0-9]+-[a-z0-9]+"
{{- end }}

{{/*
Checks that cannot be expressed in values.schema.json, or that must hold even when the
schema is skipped. Included by the Deployment, which every render contains.
*/}}
{{- define "asgi-admission.validate" -}}
{{- if not (dig "limits" "memory" "" (.Values.resources | default dict)) }}
{{- fail "resources.limits.memory is required: asgi-admission decides admission from the container's cgroup memory limit, and without a limit it can only count sessions, so set a limit such as --set resources.limits.memory=2Gi." }}
{{- end }}
{{- if and .Values.autoscaling.hpa.enabled .Values.autoscaling.keda.enabled }}
{{- fail "autoscaling.hpa.enabled and autoscaling.keda.enabled are both true: KEDA creates and manages its own HorizontalPodAutoscaler for the Deployment, so enable only one of them." }}
{{- end }}
{{- if not (has .Values.autoscaling.hpa.scaleOn (list "memory" "admissible")) }}
{{- fail (printf "autoscaling.hpa.scaleOn is %q: it must be \"memory\" (the pods' memory usage ratio) or \"admissible\" (the pods' session fullness)." (toString .Values.autoscaling.hpa.scaleOn)) }}
{{- end }}
{{- if .Values.autoscaling.hpa.enabled }}
{{- $mode := toString .Values.autoscaling.hpa.scaleOn }}
{{- $metric := get .Values.autoscaling.hpa $mode | default dict }}
{{- if not (and $metric.metricName $metric.targetAverageValue) }}
{{- fail (printf "autoscaling.hpa.%s needs its metricName and targetAverageValue (autoscaling.hpa.scaleOn is %q): set them, or leave the block at the chart's default." $mode $mode) }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled are both true: each pod would be scraped twice and every series duplicated, so enable only one of them." }}
{{- end }}
{{- if and .Values.metrics.port (eq (int .Values.metrics.port) (int .Values.containerPort)) }}
{{- fail "metrics.port equals containerPort: a separate metrics port must differ from the application port; leave metrics.port empty to serve /metrics on the application port." }}
{{- end }}
{{- with .Values.roomReport.agentPort }}
{{- if or (eq (int .) (int $.Values.containerPort)) (and $.Values.metrics.port (eq (int .) (int $.Values.metrics.port))) }}
{{- fail "roomReport.agentPort equals containerPort or metrics.port: the agent-check listener needs a port of its own, which HAProxy's agent-port names." }}
{{- end }}
{{- end }}
{{- if gt (float64 .Values.admission.resumeThresholdPercent) (float64 .Values.admission.highWatermarkPercent) }}
{{- fail "admission.resumeThresholdPercent is above admission.highWatermarkPercent: the latch resumes admitting below the high watermark, so the resume threshold must be at or below it." }}
{{- end }}
{{- if le (float64 .Values.admission.criticalWatermarkPercent) (float64 .Values.admission.highWatermarkPercent) }}
{{- fail "admission.criticalWatermarkPercent is not above admission.highWatermarkPercent: the watchdog halts running sessions only after admission has stopped new ones, so the critical watermark must be higher." }}
{{- end }}
{{- include "asgi-admission.validatePriorityClasses" . }}
{{- $reserve := .Values.admission.sessionReserveMB }}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- $limitMiB := include "asgi-admission.memoryMiB" $limit }}
{{- if and (not (kindIs "invalid" $reserve)) $limitMiB }}
{{- $high := float64 .Values.admission.highWatermarkPercent }}
{{- $ceiling := divf (mulf (float64 $limitMiB) $high) 100.0 }}
{{- if ge (float64 $reserve) $ceiling }}
{{- $derived := divf (float64 $limitMiB) 8.0 }}
{{- if gt $derived 768.0 }}{{- $derived = 768.0 }}{{- end }}
{{- fail (printf "admission.sessionReserveMB=%v cannot fit under the high watermark (%v%%) of resources.limits.memory=%v, which leaves %.1f MiB: no session could ever be admitted and the pods would never become Ready. Set admission.sessionReserveMB below %.0f, or leave it unset (null) to derive the reserve from the limit (an eighth of it, %.0f MiB here)." (toString $reserve) $high (toString $limit) $ceiling (floor $ceiling) $derived) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A Kubernetes memory quantity ("512Mi", "4Gi", "1G", "536870912") in MiB, as a number;
empty for a form it does not know (the API server then has the last word on it).
*/}}
{{- define "asgi-admission.memoryMiB" -}}
{{- $quantity := toString . | trim }}
{{- $number := regexFind "^[0-9]+([.][0-9]+)?" $quantity }}
{{- $suffix := trimPrefix $number $quantity }}
{{- $factors := dict "" 1.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 }}
{{- if and $number (hasKey $factors $suffix) }}
{{- divf (mulf (float64 $number) (get $factors $suffix)) 1048576.0 }}
{{- end }}
{{- end }}

{{/*
scheduling.priorityClasses as ADMISSION_PRIORITY_CLASSES: "critical=90,batch=65".
*/}}
{{- define "asgi-admission.priorityClasses" -}}
{{- $entries := list }}
{{- range .Values.scheduling.priorityClasses }}
{{- $entries = append $entries (printf "%s=%v" .name .highWatermarkPercent) }}
{{- end }}
{{- join "," $entries }}
{{- end }}

{{/*
What the schema cannot say of scheduling.priorityClasses: each name once, each ceiling at
most the one before it (the first class is served first) and above the gap between the
high watermark and the resume threshold, where a class's latch clears.
*/}}
{{- define "asgi-admission.validatePriorityClasses" -}}
{{- $gap := subf (float64 .Values.admission.highWatermarkPercent) (float64 .Values.admission.resumeThresholdPercent) }}
{{- $seen := dict }}
{{- $above := "" }}
{{- $aboveCeiling := 100.0 }}
{{- range .Values.scheduling.priorityClasses }}
{{- $ceiling := float64 .highWatermarkPercent }}
{{- if hasKey $seen .name }}
{{- fail (printf "scheduling.priorityClasses names the class %q twice: give each class one name, used once." .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- if le $ceiling $gap }}
{{- fail (printf "scheduling.priorityClasses: the class %q has the ceiling %v, at or below %v (admission.highWatermarkPercent less admission.resumeThresholdPercent), where its latch would have to clear: no session of it could be admitted once the latch set. Raise its ceiling above %v." .name .highWatermarkPercent $gap $gap) }}
{{- end }}
{{- if gt $ceiling $aboveCeiling }}
{{- fail (printf "scheduling.priorityClasses: the class %q (%v) comes after %q (%v) but has a higher ceiling; classes are served in the order given, so list them from the highest ceiling down." .name .highWatermarkPercent $above $aboveCeiling) }}
{{- end }}
{{- $above = .name }}
{{- $aboveCeiling = $ceiling }}
{{- end }}
{{- end }}
