package docsnippets

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"gopkg.in/yaml.v3"

	// Every Envoy type a snippet uses, directly or inside an Any, must be registered.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// docFiles are the documents whose snippets these tests own.
var docFiles = []string{"integration.md", "operations.md", "architecture.md", "configuration.md"}

// snippet is one fenced block of a document.
type snippet struct {
	file string
	line int    // of the opening fence
	lang string // yaml, json, text, ...
	kind string // what it is; empty for blocks that are not configuration
	body []byte
}

func (s snippet) String() string { return fmt.Sprintf("%s:%d (%s)", s.file, s.line, s.kind) }

// readSnippets returns every fenced block of the docs files.
func readSnippets(t *testing.T) []snippet {
	t.Helper()
	var out []snippet
	for _, name := range docFiles {
		path := filepath.Join("..", "..", "docs", name)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, parseFences(name, data)...)
	}
	return out
}

// parseFences splits markdown into its ``` blocks; the info string is "lang kind".
func parseFences(name string, data []byte) []snippet {
	var out []snippet
	var cur *snippet
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			fields := strings.Fields(strings.TrimPrefix(trimmed, "```"))
			cur = &snippet{file: name, line: n}
			if len(fields) > 0 {
				cur.lang = fields[0]
			}
			if len(fields) > 1 {
				cur.kind = fields[1]
			}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body = append(cur.body, line+"\n"...)
		}
	}
	return out
}

// isConfig reports whether a block is configuration that must be loaded.
func isConfig(s snippet) bool { return s.lang == "yaml" || s.lang == "json" }

// toJSON turns a YAML (or JSON) snippet into JSON for protojson.
func toJSON(s snippet) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(s.body, &v); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	return json.Marshal(v)
}

// decodeEnvoy decodes a snippet into the Envoy message its kind names, rejecting unknown
// fields, and runs the message's validation rules.
func decodeEnvoy(s snippet) (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(s.kind))
	if err != nil {
		return nil, fmt.Errorf("unknown Envoy type %q (import its package in this test): %w", s.kind, err)
	}
	js, err := toJSON(s)
	if err != nil {
		return nil, err
	}
	msg := mt.New().Interface()
	if err := protojson.Unmarshal(js, msg); err != nil {
		return nil, fmt.Errorf("does not decode as %s: %w", s.kind, err)
	}
	if v, ok := msg.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return nil, fmt.Errorf("fails %s validation: %w", s.kind, err)
		}
	}
	return msg, nil
}
