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
{{- define "gpu-dra.faultsName" -}}{{ include "gpu-dra.fullname" . }}-faults{{- end }}

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

{{/* The CEL expression that matches this driver's devices; used by every DeviceClass. */}}
{{- define "gpu-dra.deviceSelector" -}}
device.driver == {{ .Values.driverName | quote }}
{{- end }}

{{/*
deviceClasses resolved, as a JSON list of {name, extendedResourceName, selectors, config}: "" names
become driverName, an omitted extendedResourceName becomes <name>/gpu ("" for none). The schema
checks each entry; what it cannot express (names unique after defaulting, defaulted extended
resource names valid) fails the render here. Use: include "gpu-dra.deviceClasses" . | fromJsonArray
*/}}
{{- define "gpu-dra.deviceClasses" -}}
{{- $root := . -}}
{{- $classes := list -}}
{{- $names := dict -}}
{{- $resources := dict -}}
{{- range $i, $c := .Values.deviceClasses -}}
{{- $c = $c | default dict -}}
{{- $name := $c.name | default $root.Values.driverName -}}
{{- if hasKey $names $name -}}
{{- fail (printf `deviceClasses[%d].name: DeviceClass %q is also deviceClasses[%v]; give each class its own name ("" stands for driverName)` $i $name (get $names $name)) -}}
{{- end -}}
{{- $_ := set $names $name $i -}}
{{- $resource := printf "%s/gpu" $name -}}
{{- if hasKey $c "extendedResourceName" }}{{ $resource = $c.extendedResourceName | default "" }}{{ end -}}
{{- if $resource -}}
{{- $domain := dir $resource -}}
{{- if or (not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$` $resource)) (gt (len (base $resource)) 63) (gt (len $domain) 244) (contains "kubernetes.io" $domain) -}}
{{- fail (printf `deviceClasses[%d].extendedResourceName: %q is not an extended resource name (a DNS domain outside kubernetes.io, /, a name of at most 63 characters, e.g. example.com/gpu); set one, or "" for none` $i $resource) -}}
{{- end -}}
{{- if hasKey $resources $resource -}}
{{- fail (printf "deviceClasses[%d].extendedResourceName: %q is also the extended resource of deviceClasses[%v]; a name can select one class only" $i $resource (get $resources $resource)) -}}
{{- end -}}
{{- $_ := set $resources $resource $i -}}
{{- end -}}
{{- $classes = append $classes (dict "name" $name "extendedResourceName" $resource "selectors" ($c.selectors | default list) "config" ($c.config | default list)) -}}
{{- end -}}
{{- if not $classes -}}
{{- fail `deviceClasses: empty; the chart needs at least one DeviceClass (the pod annotations use the first), e.g. deviceClasses: [{name: ""}]` -}}
{{- end -}}
{{- toJson $classes -}}
{{- end }}

{{/*
Resource names pods may list in resources.limits to get GPUs: each class's extendedResourceName and
its implicit deviceclass.resource.kubernetes.io/<class>. As a CEL list literal.
*/}}
{{- define "gpu-dra.extendedResourceNames" -}}
{{- $names := list -}}
{{- range include "gpu-dra.deviceClasses" . | fromJsonArray -}}
{{- if .extendedResourceName }}{{ $names = append $names (printf "'%s'" .extendedResourceName) }}{{ end -}}
{{- $names = append $names (printf "'deviceclass.resource.kubernetes.io/%s'" .name) -}}
{{- end -}}
[{{ join ", " $names }}]
{{- end }}

{{/*
Whether the cluster's resource.k8s.io schema has DeviceClass spec.extendedResourceName: every
version of it has since 1.34, the release that also serves resource.k8s.io/v1. Whether the API
server keeps the field is a feature gate no render can see; the webhook finds out by reading the
stored class back. On 1.32/1.33 the field must not be sent at all: helm installs server-side, and
server-side apply refuses fields the schema does not declare.
*/}}
{{- define "gpu-dra.hasExtendedResourceName" -}}
{{- if or (.Capabilities.APIVersions.Has "resource.k8s.io/v1") (eq (include "gpu-dra.resourceApiVersion" .) "resource.k8s.io/v1") }}true{{ end }}
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
this driver's business. A request or subrequest names one of this chart's DeviceClasses (v1beta1
requests carry deviceClassName themselves, v1beta2/v1 under exactly or firstAvailable[]) or has a
selector that mentions the driver (its attribute domain, or device.driver), or the claim carries
opaque config for the driver. A template's claim spec is spec.spec, a claim's is spec.
*/}}
{{- define "gpu-dra.claimIsForDriver" -}}
{{- $spec := "object.spec.?spec.orValue(object.spec)" -}}
{{- $driver := printf "'%s'" .Values.driverName -}}
{{- $classes := list -}}
{{- range include "gpu-dra.deviceClasses" . | fromJsonArray }}{{ $classes = append $classes (printf "'%s'" .name) }}{{ end -}}
{{ $spec }}.?devices.?requests.orValue([]).exists(r,
  ([r, r.?exactly.orValue({})] + r.?firstAvailable.orValue([])).exists(x,
    x.?deviceClassName.orValue('') in [{{ join ", " $classes }}] ||
    x.?selectors.orValue([]).exists(s, s.?cel.?expression.orValue('').contains({{ $driver }})))) ||
{{ $spec }}.?devices.?config.orValue([]).exists(c, c.?opaque.?driver.orValue('') == {{ $driver }})
{{- end }}

{{/*
matchConditions shared by every claim webhook entry. Claims the resourceclaim controller creates
for pods from a ResourceClaimTemplate are copies of a template already judged when it was created,
so they never wait on this webhook (kube-controller-manager's identity with and without
--use-service-account-credentials). Nor do the claims the scheduler creates for a pod's extended
resources (KEP-5004, annotated resource.kubernetes.io/extended-resource-claim: "true"): they come
from a DeviceClass and a count, in the scheduler's binding step, where a webhook outage would hold
the pod; they are recognized by the annotation because the scheduler's identity differs between
clusters (and an annotation a user copies onto a claim skips only these checks, no authorization).
*/}}
{{- define "gpu-dra.notGeneratedClaim" -}}
- name: not-generated-from-a-template
  expression: "!(request.userInfo.username in ['system:serviceaccount:kube-system:resource-claim-controller', 'system:kube-controller-manager'])"
- name: not-generated-for-extended-resources
  expression: "!(has(object.metadata.annotations) && object.metadata.annotations[?'resource.kubernetes.io/extended-resource-claim'].orValue('') == 'true')"
{{- end }}

{{/* What the claim webhook entries share: include "gpu-dra.claimWebhook" (dict "root" . "path" "/validate-resource-claim") */}}
{{- define "gpu-dra.claimWebhook" -}}
admissionReviewVersions: [v1]
{{ include "gpu-dra.webhookClientConfig" . }}
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
{{ include "gpu-dra.webhookNamespaceSelector" .root }}
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

{{/*
The webhook's GOMEMLIMIT in bytes: webhook.goMemLimitPercent of resources.limits.memory. The Go
runtime's soft limit bounds its own memory only; the binary's pages (about 35 MiB) and the
kernel's share of the container's memory come on top, so the limit is set well under the
container's.
*/}}
{{- define "gpu-dra.webhookGoMemLimit" -}}
{{- $q := toString .Values.webhook.resources.limits.memory -}}
{{- $unit := regexFind "(Ki|Mi|Gi|Ti|k|M|G|T)$" $q -}}
{{- $n := trimSuffix $unit $q -}}
{{- if not (regexMatch "^[0-9]+$" $n) -}}
{{- fail (printf "webhook.resources.limits.memory=%q: with webhook.goMemLimitPercent set, want a whole number with an optional unit (Ki, Mi, Gi, Ti, k, M, G, T), e.g. 256Mi; or set webhook.goMemLimitPercent=0" $q) -}}
{{- end -}}
{{- $scale := get (dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776) $unit -}}
{{- div (mul (int64 $n) $scale (int64 .Values.webhook.goMemLimitPercent)) 100 -}}
{{- end -}}
