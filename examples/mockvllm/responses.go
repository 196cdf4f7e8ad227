package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/meridian-router/meridian/extproc/request"
)

// responses serves the Responses API (/v1/responses): one assistant message of output
// text, as an object or as the API's named event stream (response.created ...
// response.output_text.delta ... response.completed). It keeps no state:
// previous_response_id is accepted and not looked up, store is not honoured.
func (s *server) responses(w http.ResponseWriter, r *http.Request) {
	if s.faults.inject(w, r) {
		return
	}
	var pr request.Request
	body, status, err := s.readParsed(w, r, request.Responses, &pr)
	if err != nil {
		writeError(w, status, errorType(status), err.Error())
		return
	}
	var opt struct {
		MaxOutputTokens *int `json:"max_output_tokens"`
	}
	if err := json.Unmarshal(body, &opt); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON body: "+err.Error())
		return
	}
	output := s.cfg.maxTokens
	if opt.MaxOutputTokens != nil {
		if *opt.MaxOutputTokens < 1 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("max_output_tokens must be at least 1, got %d", *opt.MaxOutputTokens))
			return
		}
		output = *opt.MaxOutputTokens
	}
	prompt := promptTokens(pr)
	st, cancel, err := s.backend.submit(prompt, output, pr.Blocks)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	defer cancel()
	n := s.ids.Add(1)
	rs := responseState{id: fmt.Sprintf("resp_%s-%d", s.cfg.name, n), msgID: fmt.Sprintf("msg_%s-%d", s.cfg.name, n),
		model: pr.Model, created: time.Now().Unix(), prompt: prompt, capped: opt.MaxOutputTokens != nil}
	if !pr.Stream {
		if !waitDone(r, st) {
			return
		}
		gen, cached, _ := st.snapshot()
		writeJSON(w, http.StatusOK, rs.object(gen, cached, true))
		return
	}
	rs.stream(w, r, st)
}

// responseState is what one Responses API answer needs to describe itself.
type responseState struct {
	id, msgID, model string
	created          int64
	prompt           int
	capped           bool // max_output_tokens was set: reaching it leaves the response incomplete
	seq              int
}

func (rs *responseState) part(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
}

func (rs *responseState) item(text string, done bool) map[string]any {
	status, content := "in_progress", []any{}
	if done {
		status, content = "completed", []any{rs.part(text)}
	}
	return map[string]any{"type": "message", "id": rs.msgID, "status": status, "role": "assistant", "content": content}
}

// object is the response object after gen tokens; final is false while it streams.
func (rs *responseState) object(gen, cached int, final bool) map[string]any {
	o := map[string]any{
		"id": rs.id, "object": "response", "created_at": rs.created, "model": rs.model,
		"status": "in_progress", "output": []any{}, "error": nil, "incomplete_details": nil,
		"instructions": nil, "metadata": map[string]any{}, "parallel_tool_calls": true,
		"tool_choice": "auto", "tools": []any{}, "temperature": 1.0, "top_p": 1.0,
		"text": map[string]any{"format": map[string]any{"type": "text"}}, "truncation": "disabled",
		"usage": nil,
	}
	if final {
		o["status"] = "completed"
		if rs.capped {
			o["status"], o["incomplete_details"] = "incomplete", map[string]any{"reason": "max_output_tokens"}
		}
		o["output"] = []any{rs.item(strings.Repeat("tok ", gen), true)}
		o["usage"] = map[string]any{
			"input_tokens": rs.prompt, "input_tokens_details": map[string]any{"cached_tokens": cached},
			"output_tokens": gen, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
			"total_tokens": rs.prompt + gen,
		}
	}
	return o
}

// emit writes one event of the stream, numbering it.
func (rs *responseState) emit(out sse, typ string, fields map[string]any) {
	fields["type"], fields["sequence_number"] = typ, rs.seq
	rs.seq++
	out.event(typ, fields)
}

func (rs *responseState) stream(w http.ResponseWriter, r *http.Request, st *stream) {
	out := newSSE(w)
	at := func(extra map[string]any) map[string]any {
		extra["item_id"], extra["output_index"], extra["content_index"] = rs.msgID, 0, 0
		return extra
	}
	rs.emit(out, "response.created", map[string]any{"response": rs.object(0, 0, false)})
	rs.emit(out, "response.in_progress", map[string]any{"response": rs.object(0, 0, false)})
	rs.emit(out, "response.output_item.added", map[string]any{"output_index": 0, "item": rs.item("", false)})
	rs.emit(out, "response.content_part.added", at(map[string]any{"part": rs.part("")}))
	out.flush()
	sent := 0
	for {
		gen, cached, done := st.snapshot()
		for ; sent < gen; sent++ {
			rs.emit(out, "response.output_text.delta", at(map[string]any{"delta": "tok ", "logprobs": []any{}}))
		}
		if done {
			text := strings.Repeat("tok ", gen)
			rs.emit(out, "response.output_text.done", at(map[string]any{"text": text, "logprobs": []any{}}))
			rs.emit(out, "response.content_part.done", at(map[string]any{"part": rs.part(text)}))
			rs.emit(out, "response.output_item.done", map[string]any{"output_index": 0, "item": rs.item(text, true)})
			final := rs.object(gen, cached, true)
			event := "response.completed"
			if final["status"] == "incomplete" {
				event = "response.incomplete"
			}
			rs.emit(out, event, map[string]any{"response": final})
			out.flush()
			return
		}
		out.flush()
		if !wait(r, st) {
			return
		}
	}
}
