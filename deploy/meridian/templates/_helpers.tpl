{{- define "meridian.fullname" -}}
{{- printf "%s-meridian" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meridian.labels" -}}
app.kubernetes.io/name: meridian
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "meridian.controlSelector" -}}
app.kubernetes.io/name: meridian
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: control
{{- end -}}

{{- define "meridian.gatewaySelector" -}}
app.kubernetes.io/name: meridian
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{/* The namespace engines are discovered in. */}}
{{- define "meridian.discoveryNamespace" -}}
{{- $k := (.Values.fleet.discovery | default dict).kubernetes | default dict -}}
{{- $k.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The control servers' xDS address, as a DNS name (a headless Service: every replica). */}}
{{- define "meridian.xdsHost" -}}
{{- printf "%s-control.%s.svc.cluster.local" (include "meridian.fullname" .) .Release.Namespace -}}
{{- end -}}
