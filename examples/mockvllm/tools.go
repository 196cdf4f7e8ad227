package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// toolDef is one entry of a chat request's tools.
type toolDef struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// toolCall is the call an answer makes.
type toolCall struct {
	ID, Name, Arguments string
}

// full is the call as a non-streamed message's tool_calls entry.
func (c *toolCall) full() map[string]any {
	return map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
}

// delta is one streamed piece of the call: the first carries the id, type and name.
func (c *toolCall) delta(first bool, args string) map[string]any {
	fn := map[string]any{"arguments": args}
	d := map[string]any{"index": 0, "function": fn}
	if first {
		d["id"], d["type"], fn["name"] = c.ID, "function", c.Name
	}
	return d
}

// chooseTool decides, as a model deterministically would, whether the answer is a tool call:
// tool_choice "none" never calls; a named function is called; "required" calls the first
// tool; "auto" (the default when tools are given) calls the first tool unless the last
// message is a tool's result, so that a client's tool loop ends with a text answer. Bad
// combinations are rejected as vLLM rejects them. The arguments fill the function's required
// parameters with placeholder values of their JSON types.
func chooseTool(tools []toolDef, choice json.RawMessage, lastRole string) (*toolCall, error) {
	mode, name, err := parseToolChoice(choice)
	if err != nil {
		return nil, err
	}
	for i, t := range tools {
		if t.Type != "function" || t.Function.Name == "" {
			return nil, fmt.Errorf("tools[%d]: only function tools with a name are supported", i)
		}
	}
	if len(tools) == 0 {
		if mode == "required" || name != "" {
			return nil, errors.New("when using `tool_choice`, `tools` must be set")
		}
		return nil, nil
	}
	var pick *toolDef
	switch {
	case name != "":
		i := slices.IndexFunc(tools, func(t toolDef) bool { return t.Function.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("tool_choice names function %q, which is not in tools", name)
		}
		pick = &tools[i]
	case mode == "required" || mode == "auto" && lastRole != "tool":
		pick = &tools[0]
	default:
		return nil, nil
	}
	args, err := placeholderArgs(pick.Function.Parameters)
	if err != nil {
		return nil, fmt.Errorf("tools: function %q: %w", pick.Function.Name, err)
	}
	return &toolCall{Name: pick.Function.Name, Arguments: args}, nil
}

func parseToolChoice(raw json.RawMessage) (mode, name string, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "auto", "", nil
	}
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &mode); err != nil {
			return "", "", fmt.Errorf("tool_choice: %w", err)
		}
		if mode != "none" && mode != "auto" && mode != "required" {
			return "", "", fmt.Errorf("tool_choice %q: want none, auto, required or a named function", mode)
		}
		return mode, "", nil
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return "", "", errors.New(`tool_choice must be "none", "auto", "required" or {"type":"function","function":{"name":...}}`)
	}
	return "", named.Function.Name, nil
}

// placeholderArgs is a JSON object with a value of the right type for every required
// property of a JSON-schema object.
func placeholderArgs(schema json.RawMessage) (string, error) {
	var s struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if len(schema) > 0 {
		if err := json.Unmarshal(schema, &s); err != nil {
			return "", fmt.Errorf("parameters is not a JSON schema object: %w", err)
		}
	}
	args := map[string]any{}
	for _, name := range s.Required {
		typ, _ := s.Properties[name].Type.(string)
		switch typ {
		case "integer", "number":
			args[name] = 1
		case "boolean":
			args[name] = true
		case "array":
			args[name] = []any{}
		case "object":
			args[name] = map[string]any{}
		default:
			args[name] = "tok"
		}
	}
	b, err := json.Marshal(args)
	return string(b), err
}
