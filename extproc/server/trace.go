package server

import (
	"encoding/hex"
	"math/rand/v2"
)

// appendChildTraceparent appends the continuation of the W3C trace context (https://www.w3.org/TR/trace-context/)
// of a request: the engine sees the same trace id with a new parent span id, the sidecar's
// routing step. A request without a valid traceparent starts a new, unsampled trace, so
// engine logs can still be correlated.
func appendChildTraceparent(dst []byte, parent string) []byte {
	var out [55]byte // "00-" trace(32) "-" span(16) "-" flags(2)
	copy(out[:3], "00-")
	if validTraceparent(parent) {
		copy(out[3:35], parent[3:35])
		copy(out[53:55], parent[53:55])
	} else {
		var id [16]byte
		putUint64(id[:8], rand.Uint64())
		putUint64(id[8:], rand.Uint64()|1) // an all-zero trace id is invalid
		hex.Encode(out[3:35], id[:])
		copy(out[53:55], "00")
	}
	out[35], out[52] = '-', '-'
	var span [8]byte
	putUint64(span[:], rand.Uint64()|1)
	hex.Encode(out[36:52], span[:])
	return append(dst, out[:]...)
}

func putUint64(b []byte, v uint64) {
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

// validTraceparent accepts version 00 exactly: 2-32-16-2 lowercase hex fields, ids not all
// zero.
func validTraceparent(s string) bool {
	if len(s) != 55 || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return false
	}
	return isHex(s[3:35]) && isHex(s[36:52]) && isHex(s[53:55]) &&
		s[3:35] != "00000000000000000000000000000000" && s[36:52] != "0000000000000000"
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
