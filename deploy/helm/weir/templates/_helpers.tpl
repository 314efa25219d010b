{{/* The release's name, the chart's when they differ, within the 63 characters a name may have. */}}
{{- define "weir.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Kubernetes' recommended labels; pass (dict "ctx" $ "component" "dataplane"). */}}
{{- define "weir.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: weir
{{- end -}}

{{/* The labels that select one component's pods: they never change after install. */}}
{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "weir.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret holding the tokens, the key and the database URL. */}}
{{- define "weir.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "weir.fullname" .) -}}
{{- end -}}

{{/* An env var from the secret; pass (dict "ctx" $ "name" "WEIR_ADMIN_TOKEN" "key" "adminToken"). */}}
{{- define "weir.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "weir.secretName" .ctx }}
      key: {{ index .ctx.Values.secrets.keys .key }}
{{- end -}}

{{/* Extra env from values, name: value, in a stable order. */}}
{{- define "weir.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end -}}
{{- end -}}

{{/* The hardening the distroless nonroot image allows: weir writes nothing to disk in a cluster. */}}
{{- define "weir.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "weir.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}
