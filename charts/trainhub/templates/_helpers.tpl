{{/* The chart's name, or nameOverride. */}}
{{- define "trainhub.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of the release's objects: fullnameOverride, or release-chart (the release name alone when it contains the chart's). */}}
{{- define "trainhub.fullname" -}}
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

{{- define "trainhub.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainhub.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trainhub.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "trainhub.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainhub
{{- end }}

{{- define "trainhub.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainhub.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret with the serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "trainhub.tlsSecretName" -}}
{{- if .Values.certManager.enabled }}
{{- printf "%s-tls" (include "trainhub.fullname" .) }}
{{- else }}
{{- required "tls.existingSecret: name the Secret with the hub's serving certificate (tls.crt, tls.key, ca.crt), or set certManager.enabled" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{/* The Secret with the CA of spoke certificates. */}}
{{- define "trainhub.spokeCASecretName" -}}
{{- default (include "trainhub.tlsSecretName" .) .Values.spokeCA.existingSecret }}
{{- end }}

{{- define "trainhub.grpcServiceName" -}}
{{- printf "%s-grpc" (include "trainhub.fullname" .) }}
{{- end }}

{{/* The in-cluster DNS names of both Services. */}}
{{- define "trainhub.serviceDNSNames" -}}
{{- $ns := .Release.Namespace }}
{{- range $svc := list (include "trainhub.fullname" .) (include "trainhub.grpcServiceName" .) }}
- {{ $svc }}
- {{ $svc }}.{{ $ns }}
- {{ $svc }}.{{ $ns }}.svc
- {{ $svc }}.{{ $ns }}.svc.cluster.local
{{- end }}
{{- end }}

{{- define "trainhub.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The security context of every container: non-root, read-only root, no privilege. */}}
{{- define "trainhub.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* "true" when the hub keeps its objects in etcd (any replica count). */}}
{{- define "trainhub.etcd" -}}
{{- if eq .Values.store.type "etcd" }}true{{ end }}
{{- end }}

{{/* "true" when several replicas share etcd: one leads, the others follow. */}}
{{- define "trainhub.replicated" -}}
{{- if and (eq .Values.store.type "etcd") (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* Whether the data directory is a PersistentVolumeClaim (redb only). */}}
{{- define "trainhub.persistent" -}}
{{- if and .Values.persistence.enabled (ne .Values.store.type "etcd") }}true{{ end }}
{{- end }}
