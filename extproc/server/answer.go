package server

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-router/meridian/xdsapi"
)

// steerHeaders is the most headers a steered answer sets.
const steerHeaders = 8

// answer holds every message of one steered answer (the headers or body response, its
// header mutation, the header values and the envoy.lb metadata) in one allocation: the
// request path builds a few dozen protobuf messages per request otherwise. An answer is
// written once, then only read (by gRPC's marshaling).
type answer struct {
	resp     extprocv3.ProcessingResponse
	onHdrs   extprocv3.ProcessingResponse_RequestHeaders
	onBody   extprocv3.ProcessingResponse_RequestBody
	headers  extprocv3.HeadersResponse
	body     extprocv3.BodyResponse
	common   extprocv3.CommonResponse
	mutation extprocv3.HeaderMutation
	set      [steerHeaders]*corev3.HeaderValueOption
	opts     [steerHeaders]corev3.HeaderValueOption
	vals     [steerHeaders]corev3.HeaderValue
	n        int
	raw      []byte // header values, backed by rawBuf unless they outgrow it
	rawBuf   [384]byte

	meta, lb          structpb.Struct
	lbValue, dstValue structpb.Value
	lbKind            structpb.Value_StructValue
	dstKind           structpb.Value_StringValue
	decision          decisionMeta // under xdsapi.MetadataNamespaceDecision, for the access log
}

func newAnswer() *answer {
	a := &answer{}
	a.raw = a.rawBuf[:0]
	return a
}

// set adds one header that overwrites any the request has.
func (a *answer) setHeader(k string, v []byte) {
	start := len(a.raw)
	a.raw = append(a.raw, v...)
	a.vals[a.n] = corev3.HeaderValue{Key: k, RawValue: a.raw[start:len(a.raw):len(a.raw)]}
	a.opts[a.n] = corev3.HeaderValueOption{Header: &a.vals[a.n], AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	a.set[a.n] = &a.opts[a.n]
	a.n++
}

// setString is setHeader for a string value.
func (a *answer) setString(k, v string) {
	start := len(a.raw)
	a.raw = append(a.raw, v...)
	a.setHeaderRaw(k, start)
}

func (a *answer) setHeaderRaw(k string, start int) {
	a.vals[a.n] = corev3.HeaderValue{Key: k, RawValue: a.raw[start:len(a.raw):len(a.raw)]}
	a.opts[a.n] = corev3.HeaderValueOption{Header: &a.vals[a.n], AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	a.set[a.n] = &a.opts[a.n]
	a.n++
}

// finish links the messages: the header mutation clears Envoy's route cache (the route
// depends on x-meridian-cluster), dest goes into envoy.lb, where override_host and the
// endpoint-picker protocol read it, and the decision (decisionMeta.fill's) into its own
// namespace.
func (a *answer) finish(dest string, decision *structpb.Value) {
	a.mutation.SetHeaders = a.set[:a.n]
	a.common = extprocv3.CommonResponse{HeaderMutation: &a.mutation, ClearRouteCache: true}
	a.dstKind.StringValue = dest
	a.dstValue.Kind = &a.dstKind
	a.lb.Fields = map[string]*structpb.Value{xdsapi.HeaderDestination: &a.dstValue}
	a.lbKind.StructValue = &a.lb
	a.lbValue.Kind = &a.lbKind
	a.meta.Fields = map[string]*structpb.Value{xdsapi.MetadataNamespaceLB: &a.lbValue, xdsapi.MetadataNamespaceDecision: decision}
	a.resp.DynamicMetadata = &a.meta
}

// headersResponse is the answer to the request headers (a held, streamed body).
func (a *answer) headersResponse() *extprocv3.ProcessingResponse {
	a.headers.Response = &a.common
	a.onHdrs.RequestHeaders = &a.headers
	a.resp.Response = &a.onHdrs
	return &a.resp
}

// bodyResponse is the answer to a buffered body message.
func (a *answer) bodyResponse() *extprocv3.ProcessingResponse {
	a.body.Response = &a.common
	a.onBody.RequestBody = &a.body
	a.resp.Response = &a.onBody
	return &a.resp
}
