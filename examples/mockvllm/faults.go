package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
)

// Faults is the fault-injection state, as set by flags and by POST /admin/faults.
type Faults struct {
	// ErrorRate is the fraction in [0, 1] of generation requests answered with an error.
	ErrorRate float64 `json:"error_rate"`
	// ErrorStatus is the HTTP status of those answers, in [400, 599]; 0 means 500.
	ErrorStatus int `json:"error_status,omitempty"`
	// LatencyMultiplier (> 0) multiplies every engine step or fixed latency.
	LatencyMultiplier float64 `json:"latency_multiplier"`
	// Hang holds generation requests without an answer until the client gives up or hang
	// is turned off.
	Hang bool `json:"hang"`
	// CloseConnections closes each generation request's connection without an answer.
	CloseConnections bool `json:"close_connections"`
}

// Validate reports out-of-range fields without changing them.
func (f Faults) Validate() error {
	var errs []error
	if !(f.ErrorRate >= 0 && f.ErrorRate <= 1) {
		errs = append(errs, fmt.Errorf("error_rate is %v, must be in [0, 1]", f.ErrorRate))
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599) {
		errs = append(errs, fmt.Errorf("error_status is %d, must be in [400, 599] (or 0 for 500)", f.ErrorStatus))
	}
	if !(f.LatencyMultiplier > 0) {
		errs = append(errs, fmt.Errorf("latency_multiplier is %v, must be positive", f.LatencyMultiplier))
	}
	return errors.Join(errs...)
}

// faultState holds the current Faults; the zero value is not usable, see newFaultState.
type faultState struct {
	apply  func(Faults) // pushes the latency multiplier into the backend
	mu     sync.Mutex
	cur    Faults
	unhang chan struct{} // closed when Hang turns off
}

func newFaultState(f Faults, apply func(Faults)) *faultState {
	s := &faultState{apply: apply, unhang: make(chan struct{})}
	s.set(f)
	return s
}

func (s *faultState) get() (Faults, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.unhang
}

func (s *faultState) set(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur.Hang && !f.Hang {
		close(s.unhang)
		s.unhang = make(chan struct{})
	}
	s.cur = f
	s.apply(f)
}

// release frees hung requests at shutdown.
func (s *faultState) release() {
	f, _ := s.get()
	f.Hang = false
	s.set(f)
}

// inject applies the faults to one generation request. It reports whether the request
// was consumed (answered, closed, or abandoned by its client).
func (s *faultState) inject(w http.ResponseWriter, r *http.Request) bool {
	f, unhang := s.get()
	if f.CloseConnections {
		closeConn(w)
		return true
	}
	if f.Hang {
		select {
		case <-unhang:
		case <-r.Context().Done():
			return true
		}
	}
	if f.ErrorRate > 0 && rand.Float64() < f.ErrorRate {
		status := f.ErrorStatus
		if status == 0 {
			status = http.StatusInternalServerError
		}
		writeError(w, status, errorType(status), "injected fault: error_rate")
		return true
	}
	return false
}

// closeConn drops the client's connection without an HTTP answer, as a crashing engine would.
func closeConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler) // HTTP/2: the server resets the stream
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func (s *faultState) handleGet(w http.ResponseWriter, _ *http.Request) {
	f, _ := s.get()
	writeJSON(w, http.StatusOK, f)
}

// handlePost replaces the fault state. Absent fields take their no-fault values.
func (s *faultState) handlePost(w http.ResponseWriter, r *http.Request) {
	f := Faults{LatencyMultiplier: 1}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "faults body: "+err.Error())
		return
	}
	if err := f.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "faults: "+err.Error())
		return
	}
	s.set(f)
	writeJSON(w, http.StatusOK, f)
}
