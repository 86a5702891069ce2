{{/* The chart's name, or nameOverride. */}}
{{- define "trainspoke.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of the release's objects: fullnameOverride, or release-chart (the release name alone when it contains the chart's). */}}
{{- define "trainspoke.fullname" -}}
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

{{- define "trainspoke.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainspoke.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trainspoke.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "trainspoke.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainhub
{{- end }}

{{- define "trainspoke.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainspoke.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret with the client certificate (tls.crt, tls.key) and, unless tls.caSecret, ca.crt. */}}
{{- define "trainspoke.tlsSecretName" -}}
{{- if .Values.certManager.enabled }}
{{- printf "%s-tls" (include "trainspoke.fullname" .) }}
{{- else }}
{{- required "tls.existingSecret: name the Secret with this spoke's certificate (tls.crt, tls.key, ca.crt; trainctl certs spoke), or set certManager.enabled" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{- define "trainspoke.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The security context of every container: non-root, read-only root, no privilege. */}}
{{- define "trainspoke.containerSecurityContext" -}}
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
