{{/* Names: every object is "<fullname>-<role>", so two releases in one cluster never collide. */}}
{{- define "tessera.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.name" -}}
{{- printf "%s-%s" (include "tessera.fullname" .root) .role -}}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "tessera.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Where capacity pods live (and so where the gpu-agent's, the pool manager's and the tenants' start-up gate Roles
go). Never the release namespace: every tenant ServiceAccount may create and update Leases in the pool namespace
(the per-GPU start-up gate), the webhook may create pods there and the gpu-agent may patch pods there; in the
release namespace that would let a tenant take the autoscaler's leader Lease (and stop all scaling), the webhook
run a pod as the autoscaler's ServiceAccount, and the gpu-agent change the control plane's images. Nor one of
Kubernetes' own namespaces, where the Lease grant would reach node heartbeats and leader Leases (the pool
config's parse refuses the same, tessera_pool::config::RESERVED_NAMESPACES).
*/}}
{{- define "tessera.poolNamespace" -}}
{{- if and .Values.gpuPools.enabled (or (not .Values.gpuPools.namespace) (eq .Values.gpuPools.namespace .Release.Namespace)) -}}
{{- fail (printf "gpuPools.namespace must name a namespace of its own for the capacity pods, not the release namespace %q: tenants get Lease grants there, which in the release namespace would reach the autoscaler's leader Lease. Set e.g. --set gpuPools.namespace=tessera-gpus (label it pod-security.kubernetes.io/enforce=privileged, docs/install.md)." .Release.Namespace) -}}
{{- end -}}
{{- if and .Values.gpuPools.enabled (has .Values.gpuPools.namespace (list "kube-system" "kube-node-lease" "kube-public" "default")) -}}
{{- fail (printf "gpuPools.namespace %q is a namespace Kubernetes itself uses: tenants get update on the Leases of the pool namespace (the GPU start-up gate), which there would include the node heartbeats (kube-node-lease) or the control plane's leader Leases (kube-system). Set e.g. --set gpuPools.namespace=tessera-gpus (label it pod-security.kubernetes.io/enforce=privileged, docs/install.md)." .Values.gpuPools.namespace) -}}
{{- end -}}
{{- default .Release.Namespace .Values.gpuPools.namespace -}}
{{- end -}}

{{- define "tessera.activatorService" -}}
{{- include "tessera.name" (dict "root" . "role" "activator") -}}
{{- end -}}

{{/* The activator's admin Service (headless): how the autoscaler finds every activator pod's admin port. */}}
{{- define "tessera.activatorAdminService" -}}
{{- include "tessera.name" (dict "root" . "role" "activator-admin") -}}
{{- end -}}

{{/* PodMonitors when asked, or in auto mode when the Prometheus operator's API is served. */}}
{{- define "tessera.podMonitors" -}}
{{- $m := .Values.monitoring.mode -}}
{{- if or (eq $m "podMonitor") (and (eq $m "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor")) -}}
true
{{- end -}}
{{- end -}}

{{/* prometheus.io/* annotations for a pod serving /metrics on `port`, unless PodMonitors cover it. */}}
{{- define "tessera.scrapeAnnotations" -}}
{{- $m := .root.Values.monitoring.mode -}}
{{- if and (ne $m "none") (not (include "tessera.podMonitors" .root)) }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* The RBAC kind for rules over watched objects: cluster-wide unless watchNamespace narrows it. */}}
{{- define "tessera.watchKind" -}}
{{- if .Values.watchNamespace -}}Role{{- else -}}ClusterRole{{- end -}}
{{- end -}}

{{/* metadata for a (Cluster)Role or its binding over watched objects. */}}
{{- define "tessera.watchMeta" -}}
{{- if .root.Values.watchNamespace -}}
name: {{ include "tessera.name" . }}-watch
namespace: {{ .root.Values.watchNamespace }}
{{- else -}}
name: {{ printf "%s-%s" (include "tessera.name" .) .root.Release.Namespace }}
{{- end }}
labels:
  {{- include "tessera.labels" . | nindent 2 }}
{{- end -}}

{{/* Pod-level settings shared by every role. */}}
{{- define "tessera.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if gt (int .replicas) 1 }}
# Spread the replicas over nodes, so one node going down leaves one serving.
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "tessera.selectorLabels" . | nindent 14 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Environment shared by every role's container. */}}
{{- define "tessera.env" -}}
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
- name: TESSERA_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- end -}}

{{/* HTTP liveness and readiness probes on the role's /live and /ready. */}}
{{- define "tessera.probes" -}}
livenessProbe:
  httpGet: {path: /live, port: {{ .port }}{{ if .scheme }}, scheme: {{ .scheme }}{{ end }}}
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 6
readinessProbe:
  httpGet: {path: /ready, port: {{ .port }}{{ if .scheme }}, scheme: {{ .scheme }}{{ end }}}
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 3
{{- end -}}

{{/* The Secret holding the objective key (templates/objective-key.yaml), or the user's own. */}}
{{- define "tessera.objectiveKeySecret" -}}
{{- default (include "tessera.name" (dict "root" . "role" "objective-key")) .Values.objectiveKey.existingSecret -}}
{{- end -}}
