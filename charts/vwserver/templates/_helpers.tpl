{{/* The chart's name, 63 characters at most (a DNS label). */}}
{{- define "vwserver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release name, or <release>-<chart> when it does not contain it. */}}
{{- define "vwserver.fullname" -}}
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

{{/* What selects the pods (Service, PDB, NetworkPolicy, spread): never changes on upgrade. */}}
{{- define "vwserver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vwserver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vwserver.labels" -}}
{{ include "vwserver.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "vwserver.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "vwserver.tlsSecret" -}}
{{- default (printf "%s-tls" (include "vwserver.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{- define "vwserver.kcpSecret" -}}
{{- default (printf "%s-kcp-kubeconfig" (include "vwserver.fullname" .)) .Values.kcpKubeconfigSecret }}
{{- end }}

{{/*
The config file: the values' config with the keys that must match the pod's mounts set by the
chart (a deep merge: other keys of tls and upstream stay).
*/}}
{{- define "vwserver.config" -}}
{{- $mounted := dict
  "tls" (dict "certFile" "/etc/vwserver/tls/tls.crt" "keyFile" "/etc/vwserver/tls/tls.key")
  "upstream" (dict "kubeconfig" "/etc/vwserver/kcp/kubeconfig") }}
{{- toYaml (mergeOverwrite (deepCopy .Values.config) $mounted) }}
{{- end }}

{{- define "vwserver.port" -}}
{{- .Values.config.listen.port | default 8443 }}
{{- end }}
