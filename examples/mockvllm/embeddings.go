package main

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/extproc/request"
)

// embeddings serves /v1/embeddings: one vector per input, in vLLM's response shape. A vector
// is a deterministic function of its input (equal inputs, equal vectors) with unit length;
// its time is the engine's prefill of the input tokens.
func (s *server) embeddings(w http.ResponseWriter, r *http.Request) {
	if s.faults.inject(w, r) {
		return
	}
	var pr request.Request
	body, status, err := s.readParsed(w, r, request.Embeddings, &pr)
	if err != nil {
		writeError(w, status, errorType(status), err.Error())
		return
	}
	var opt struct {
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
		Dimensions     *int            `json:"dimensions"`
	}
	if err := json.Unmarshal(body, &opt); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON body: "+err.Error())
		return
	}
	if opt.EncodingFormat != "" && opt.EncodingFormat != "float" && opt.EncodingFormat != "base64" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("encoding_format %q: want float or base64", opt.EncodingFormat))
		return
	}
	dim := s.cfg.embedDim
	if opt.Dimensions != nil {
		if *opt.Dimensions < 1 || *opt.Dimensions > s.cfg.embedDim {
			writeError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("dimensions must be in [1, %d], got %d", s.cfg.embedDim, *opt.Dimensions))
			return
		}
		dim = *opt.Dimensions
	}
	inputs, err := splitInputs(opt.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	tokens := 0
	for _, in := range inputs {
		tokens += max(1, (len(in)+charsPerToken-1)/charsPerToken)
	}
	st, cancel, err := s.backend.submit(tokens, 1, pr.Blocks)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	defer cancel()
	if !waitDone(r, st) {
		return
	}
	data := make([]any, len(inputs))
	for i, in := range inputs {
		v := embed(in, dim)
		var emb any = v
		if opt.EncodingFormat == "base64" {
			b := make([]byte, 4*len(v))
			for j, x := range v {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
			}
			emb = base64.StdEncoding.EncodeToString(b)
		}
		data[i] = map[string]any{"index": i, "object": "embedding", "embedding": emb}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": fmt.Sprintf("embd-%s-%d", s.cfg.name, s.ids.Add(1)), "object": "list", "created": time.Now().Unix(),
		"model": pr.Model, "data": data,
		"usage": map[string]any{"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": nil},
	})
}

// splitInputs returns each input of a batch as its JSON text (request.Parse checked the shape).
func splitInputs(raw json.RawMessage) ([]json.RawMessage, error) {
	if len(raw) > 0 && raw[0] == '"' {
		return []json.RawMessage{raw}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("input must not be empty")
	}
	if c := items[0][0]; c != '"' && c != '[' {
		return []json.RawMessage{raw}, nil // one input of token ids
	}
	return items, nil
}

// embed is a unit vector of dim components drawn from the input's hash.
func embed(in []byte, dim int) []float32 {
	v := make([]float32, dim)
	seed := xxhash.Sum64(in)
	var norm float64
	for i := range v {
		seed = seed*6364136223846793005 + 1442695040888963407 // a 64-bit LCG step
		x := float64(int64(seed>>11))/float64(1<<52) - 1
		v[i] = float32(x)
		norm += x * x
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for i := range v {
			v[i] = float32(float64(v[i]) / norm)
		}
	}
	return v
}
