{{/* The chart's name, 63 characters at most (a DNS label). */}}
{{- define "vwserver-syncer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release name, or <release>-<chart> when it does not contain it. */}}
{{- define "vwserver-syncer.fullname" -}}
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

{{- define "vwserver-syncer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vwserver-syncer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vwserver-syncer.labels" -}}
{{ include "vwserver-syncer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "vwserver-syncer.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "vwserver-syncer.kcpSecret" -}}
{{- default (printf "%s-kcp-kubeconfig" (include "vwserver-syncer.fullname" .)) .Values.kcpKubeconfigSecret }}
{{- end }}

{{/*
The config file: the values' config with the keys the chart's objects fix (a deep merge), and
`downstream` replaced whole: this cluster, as the pod's ServiceAccount (a kubeconfig there would
be mutually exclusive with inCluster).
*/}}
{{- define "vwserver-syncer.config" -}}
{{- $fixed := dict
  "upstream" (dict "kubeconfig" "/etc/vwserver/kcp/kubeconfig")
  "leaderElection" (dict "namespace" .Release.Namespace) }}
{{- $config := mergeOverwrite (deepCopy .Values.config) $fixed }}
{{- $_ := set $config "downstream" (dict "inCluster" true) }}
{{- toYaml $config }}
{{- end }}
