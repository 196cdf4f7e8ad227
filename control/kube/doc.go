// Package kube discovers engines in a Kubernetes cluster for the control server.
//
// A Discoverer watches, with client-go informers, the EndpointSlices of Services selected by
// label and the Gateway API Inference Extension's InferencePools (v1,
// inference.networking.k8s.io) with their member pods, and turns each endpoint into a
// fleet.Discovered engine: address from the endpoint (pod IP and port), region from the
// endpoint's zone (through the fleet's zone_regions) or the topology.kubernetes.io/region
// label, models and capacity from the meridian.dev/models and meridian.dev/capacity-rps
// annotations or the source's defaults; an engine whose models nothing names is asked for
// its GET /v1/models (vLLM's model list, LoRA adapters included), retried with backoff, and
// joins once it answers. An endpoint that is not ready, or is terminating,
// is a draining engine. The fleet package validates what is found; the Discoverer reports
// each object left out as a Kubernetes Event on it, a log line and a metric, and never stops
// for one. A watch that the API server refuses (RBAC) is logged and counted naming the verb,
// resource and namespace that are missing.
package kube
