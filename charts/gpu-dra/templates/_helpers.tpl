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

{{/*
Namespaces the webhooks never see: the control plane's and the driver's own, comma-separated. The
namespaceSelector excludes them and the webhook is told (--excluded-namespaces), so that a review
for one, which only a client other than the API server can send, creates nothing there.
*/}}
{{- define "gpu-dra.excludedNamespaces" -}}
{{- join "," (list "kube-system" .Release.Namespace) }}
{{- end }}

{{- define "gpu-dra.webhookNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- range splitList "," (include "gpu-dra.excludedNamespaces" .) }}
        - {{ . }}
        {{- end }}
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

{{/*
CEL over a ResourceClaim or ResourceClaimTemplate in any resource.k8s.io version: true when it is
this driver's business. A request or subrequest names this chart's DeviceClass (v1beta1 requests
carry deviceClassName themselves, v1beta2/v1 under exactly or firstAvailable[]) or has a selector
that mentions the driver (its attribute domain, or device.driver), or the claim carries opaque
config for the driver. A template's claim spec is spec.spec, a claim's is spec.
*/}}
{{- define "gpu-dra.claimIsForDriver" -}}
{{- $spec := "object.spec.?spec.orValue(object.spec)" -}}
{{- $driver := printf "'%s'" .Values.driverName -}}
{{ $spec }}.?devices.?requests.orValue([]).exists(r,
  ([r, r.?exactly.orValue({})] + r.?firstAvailable.orValue([])).exists(x,
    x.?deviceClassName.orValue('') in [{{ $driver }}] ||
    x.?selectors.orValue([]).exists(s, s.?cel.?expression.orValue('').contains({{ $driver }})))) ||
{{ $spec }}.?devices.?config.orValue([]).exists(c, c.?opaque.?driver.orValue('') == {{ $driver }})
{{- end }}

{{/*
matchCondition shared by both claim webhooks: claims the resourceclaim controller creates for pods
from a ResourceClaimTemplate are copies of a template already judged when it was created, so they
never wait on this webhook (kube-controller-manager's identity with and without
--use-service-account-credentials).
*/}}
{{- define "gpu-dra.notGeneratedClaim" -}}
- name: not-generated-from-a-template
  expression: "!(request.userInfo.username in ['system:serviceaccount:kube-system:resource-claim-controller', 'system:kube-controller-manager'])"
{{- end }}

{{/* What both claim webhook entries share. */}}
{{- define "gpu-dra.claimWebhook" -}}
admissionReviewVersions: [v1]
{{ include "gpu-dra.webhookClientConfig" (dict "root" . "path" "/validate-resource-claim") }}
rules:
  - apiGroups: [resource.k8s.io]
    apiVersions: [v1, v1beta1, v1beta2]
    # CREATE only: both specs are immutable, so an UPDATE can only touch metadata. Sending
    # updates would put this webhook in front of the controllers that remove a claim's
    # finalizer, and a drained node's webhook (failurePolicy Fail) would leave every
    # deleted claim, and its devices, stuck until it came back.
    operations: [CREATE]
    resources: [resourceclaimtemplates, resourceclaims]
    scope: Namespaced
# Versions not listed above reach the webhook converted to one that is.
matchPolicy: Equivalent
sideEffects: None
{{ include "gpu-dra.webhookNamespaceSelector" . }}
{{- end }}

{{/* Tolerations of the plugin (and the cleanup hook, which may have only GPU nodes to run on). */}}
{{- define "gpu-dra.pluginTolerations" -}}
{{- with .Values.kubeletPlugin.tolerations }}
{{ toYaml . }}
{{- end }}
{{- if .Values.kubeletPlugin.tolerateDriverTaint }}
- key: {{ .Values.driverName }}
  operator: Exists
  effect: NoSchedule
{{- end }}
{{- end }}
