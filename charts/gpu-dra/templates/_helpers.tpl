{{/* Chart name, overridable. */}}
{{- define "gpu-dra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name of every object. */}}
{{- define "gpu-dra.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-dra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpu-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: include "gpu-dra.selectorLabels" (list . "webhook") */}}
{{- define "gpu-dra.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "gpu-dra.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "gpu-dra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpu-dra.pluginName" -}}{{ include "gpu-dra.fullname" . }}-kubelet-plugin{{- end }}
{{- define "gpu-dra.webhookName" -}}{{ include "gpu-dra.fullname" . }}-webhook{{- end }}
{{- define "gpu-dra.cleanupName" -}}{{ include "gpu-dra.fullname" . }}-cleanup{{- end }}
{{- define "gpu-dra.inventoryName" -}}{{ include "gpu-dra.fullname" . }}-inventory{{- end }}

{{/* certs.mode with auto resolved: cert-manager when the cluster serves it, else self. */}}
{{- define "gpu-dra.certMode" -}}
{{- if eq .Values.certs.mode "auto" }}
{{- if .Capabilities.APIVersions.Has "cert-manager.io/v1" }}cert-manager{{ else }}self{{ end }}
{{- else }}
{{- .Values.certs.mode }}
{{- end }}
{{- end }}

{{/* Secret the webhook serves from (self and cert-manager modes fill it; secret mode names it). */}}
{{- define "gpu-dra.certSecretName" -}}
{{- if eq (include "gpu-dra.certMode" .) "secret" }}
{{- required "certs.secret.name is required when certs.mode=secret" .Values.certs.secret.name }}
{{- else }}
{{- include "gpu-dra.webhookName" . }}-tls
{{- end }}
{{- end }}

{{/*
resource.k8s.io version for the objects the chart renders: the override, else the newest the
cluster serves. Every object is written so that it means the same in each version.
*/}}
{{- define "gpu-dra.resourceApiVersion" -}}
{{- if .Values.resourceApiVersion }}
{{- printf "resource.k8s.io/%s" .Values.resourceApiVersion }}
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1" }}
{{- "resource.k8s.io/v1" }}
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta2" }}
{{- "resource.k8s.io/v1beta2" }}
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta1" }}
{{- "resource.k8s.io/v1beta1" }}
{{- else }}
{{- fail "this cluster serves no resource.k8s.io version this chart supports (v1, v1beta2, v1beta1): on Kubernetes 1.32/1.33 enable DRA (feature gate DynamicResourceAllocation=true and --runtime-config=resource.k8s.io/v1beta1=true), or set resourceApiVersion when rendering without a cluster" }}
{{- end }}
{{- end }}

{{/* The CEL expression that matches this driver's devices; used by the DeviceClass. */}}
{{- define "gpu-dra.deviceSelector" -}}
device.driver == {{ .Values.driverName | quote }}
{{- end }}

{{/* Namespaces the webhooks never see: the control plane's and the driver's own. */}}
{{- define "gpu-dra.webhookNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        - kube-system
        - {{ .Release.Namespace }}
{{- end }}

{{- define "gpu-dra.webhookClientConfig" -}}
clientConfig:
  service:
    name: {{ include "gpu-dra.webhookName" .root }}
    namespace: {{ .root.Release.Namespace }}
    path: {{ .path }}
    port: 443
  {{- if eq (include "gpu-dra.certMode" .root) "secret" }}
  caBundle: {{ required "certs.secret.caBundle is required when certs.mode=secret" .root.Values.certs.secret.caBundle }}
  {{- end }}
{{- end }}
