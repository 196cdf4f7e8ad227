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

{{/* The Secrets holding each identity's certificate, key and CA (tls.crt, tls.key, ca.crt). */}}
{{- define "meridian.controlTLSSecret" -}}
{{- .Values.tls.secrets.control | default (printf "%s-control-tls" (include "meridian.fullname" .)) -}}
{{- end -}}
{{- define "meridian.sidecarTLSSecret" -}}
{{- .Values.tls.secrets.sidecar | default (printf "%s-sidecar-tls" (include "meridian.fullname" .)) -}}
{{- end -}}
{{- define "meridian.envoyTLSSecret" -}}
{{- .Values.tls.secrets.envoy | default (printf "%s-envoy-tls" (include "meridian.fullname" .)) -}}
{{- end -}}

{{/* Where each container finds its Secret. The Envoy paths are in files/envoy-*.sds.yaml. */}}
{{- define "meridian.tlsDir" -}}/etc/meridian-tls{{- end -}}

{{/* The TLS values, checked: a contradiction or an unsafe combination fails the render. */}}
{{- define "meridian.tlsChecked" -}}
{{- $t := .Values.tls -}}
{{- if $t.insecure -}}
  {{- if $t.certManager.enabled -}}
    {{- fail "tls.insecure=true and tls.certManager.enabled=true contradict each other: issue certificates and keep TLS on, or turn cert-manager off" -}}
  {{- end -}}
  {{- if not .Values.networkPolicy.enabled -}}
    {{- fail "tls.insecure=true needs networkPolicy.enabled=true: plaintext xDS open to every pod in the cluster lets any of them steer the fleet" -}}
  {{- end -}}
{{- else -}}
  {{- if and $t.certManager.enabled (not $t.certManager.issuerRef.name) -}}
    {{- fail "tls.certManager.enabled=true needs tls.certManager.issuerRef.name (an Issuer or ClusterIssuer that writes ca.crt, e.g. a CA issuer)" -}}
  {{- end -}}
  {{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$" .Values.gateway.nodeId) -}}
    {{- fail (printf "gateway.nodeId %q: with TLS, letters, digits and ._- only (it is in the certificates' spiffe://meridian/node/<node>/... identity and in file names)" .Values.gateway.nodeId) -}}
  {{- end -}}
{{- end -}}
{{- end -}}

{{/* The gateway's Envoy bootstrap for this release: meridian-bootstrap's output
(files/envoy.yaml with TLS, files/envoy-insecure.yaml without) with the release's names. */}}
{{- define "meridian.bootstrap" -}}
{{- $f := ternary "files/envoy-insecure.yaml" "files/envoy.yaml" (.Values.tls.insecure | default false) -}}
{{- .Files.Get $f | replace "meridian-node-id-placeholder" .Values.gateway.nodeId | replace "address: meridian-xds-placeholder, port_value: 18000" (printf "address: %s, port_value: %d" (include "meridian.xdsHost" .) (int .Values.control.xdsPort)) | replace "port_value: 10000" (printf "port_value: %d" (int .Values.gateway.port)) -}}
{{- end -}}
