package server

import (
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/xdsapi"
)

// Access log fields of a decision: the sidecar sets them as dynamic metadata under
// xdsapi.MetadataNamespaceDecision on its answer (steered or shed), and the bootstrap's
// access log prints the namespace as the entry's "decision" object. The names are
// /debug/decisions' (Explained) and the span's.
const (
	logResult     = "result"
	logModel      = "model"
	logEngines    = "engines"
	logPrefixKey  = "prefix_key"
	logPriority   = "priority"
	logPassedOver = "passed_over_for_load"
	logOverflowed = "overflowed"
	logRetries    = "retries"
	logRetryOn    = "retry_on"
	logBudget     = "retry_budget"
	logStatus     = "status"
)

// decisionMeta is one decision as dynamic metadata, every message in one allocation (it is
// part of a steered answer, written once and then only read by gRPC's marshaling).
type decisionMeta struct {
	st    structpb.Struct
	val   structpb.Value
	kind  structpb.Value_StructValue
	vals  [11]structpb.Value
	strs  [5]structpb.Value_StringValue
	nums  [4]structpb.Value_NumberValue
	flags [2]structpb.Value_BoolValue
	n     int
	ns    int
	nn    int
	nf    int
}

func (m *decisionMeta) str(k, v string) {
	m.strs[m.ns].StringValue = v
	m.vals[m.n].Kind = &m.strs[m.ns]
	m.st.Fields[k] = &m.vals[m.n]
	m.ns++
	m.n++
}

func (m *decisionMeta) flag(k string, v bool) {
	m.flags[m.nf].BoolValue = v
	m.vals[m.n].Kind = &m.flags[m.nf]
	m.st.Fields[k] = &m.vals[m.n]
	m.nf++
	m.n++
}

func (m *decisionMeta) num(k string, v float64) {
	m.nums[m.nn].NumberValue = v
	m.vals[m.n].Kind = &m.nums[m.nn]
	m.st.Fields[k] = &m.vals[m.n]
	m.nn++
	m.n++
}

// fill writes d: where a steered request goes (engines in order, whether the key's first
// engine was passed over for load, whether it overflowed to an engine outside the node's
// share, the retry grant) or why it was refused (the result names
// the shed reason; status is the sidecar's answer). It returns the namespace's value.
func (m *decisionMeta) fill(d *decide.Decision, key uint64, engines string, status int) *structpb.Value {
	m.st.Fields = make(map[string]*structpb.Value, len(m.vals))
	m.str(logResult, d.Verdict.String())
	m.str(logModel, d.Model)
	m.str(logPrefixKey, strconv.FormatUint(key, 16))
	m.num(logPriority, float64(d.Priority))
	if status != 0 {
		m.num(logStatus, float64(status))
	} else {
		m.str(logEngines, engines)
		m.str(logRetryOn, d.RetryOn)
		m.num(logRetries, float64(d.Retries))
		m.num(logBudget, float64(d.Budget))
		m.flag(logPassedOver, d.Spilled)
		m.flag(logOverflowed, d.Overflowed)
	}
	m.kind.StructValue = &m.st
	m.val.Kind = &m.kind
	return &m.val
}

// withDecision adds d's metadata to an immediate answer (a shed or no engine).
func (s *Server) withDecision(resp *extprocv3.ProcessingResponse, st *streamState, d *decide.Decision, status int) {
	m := &decisionMeta{}
	resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
		xdsapi.MetadataNamespaceDecision: m.fill(d, st.req.Key, "", status)}}
}
