package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"regexp"
	"time"

	"go.opentelemetry.io/otel/trace"
	"gopkg.in/yaml.v3"

	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/extproc/request"
)

// Config configures the sidecar's request handling. Build it from a File (DefaultFile,
// ReadFile, then File.Build), or start from DefaultConfig in code; New refuses an invalid
// one.
type Config struct {
	// Request bounds the parse and sets the routing key's ladder (request.KeyDepth):
	// KeyBlocks is its first rung, MaxBlocks its last. New sets KeyOnly. With Marks the
	// requests carry their prefix marks, which the decision core counts as pinned on the
	// engines its requests run on (decide.Config.MarkTokens).
	Request request.Options
	// PrefixMarks prices a move by what the destination lacks of the prompt, by its marks
	// (decide.Config.PrefixMarks; needs Request.Marks).
	PrefixMarks bool
	Picker      picker.Config
	// DecodeWork is the prompt-token equivalents bounded loads charge for a request's
	// decode, on top of its body's tokens (decide.Config.DecodeWork).
	DecodeWork int64
	// MoveFactor prices moving a key off its home, in prompts (decide.Config.MoveFactor).
	MoveFactor float64
	// OverflowEngines is how many engines outside the node's share may take a request its
	// own engines would queue (decide.Config.OverflowEngines).
	OverflowEngines int
	// QuotaAt holds the control server's shed quota back from requests whose engine has
	// room (decide.Config.QuotaAt).
	QuotaAt  float64
	Outliers guard.OutlierConfig
	// Retry applies until the control server sends its own budget in a policy, which then
	// wins (the control server's --retry-* flags set it).
	Retry guard.RetryConfig
	Shed  guard.ShedConfig
	// SheddableBelow makes requests of a priority below it sheddable in the Gateway API
	// Inference Extension's sense: when load sheds one, the answer is 429, the
	// endpoint-picker protocol's status for a dropped sheddable request; every other shed
	// is 503. 0 (the default): every shed is 503.
	SheddableBelow int
	Priority       PriorityConfig
	// EngineLoad is the sidecar's own scrape of its engines' load gauges.
	EngineLoad EngineLoadConfig
	// ReportInterval is how often load reports go to the control server.
	ReportInterval time.Duration
	// PlacementInterval is how often the sidecar sends the keys it placed to the control
	// server, which relays them to the node's other sidecars (placements.go).
	PlacementInterval time.Duration
	// PeerInterval is how often the sidecar sends its requests in flight to the node's
	// other sidecars that watch it (peers.go), when it serves them (--peer-listen).
	PeerInterval time.Duration
	// PenaltyInterval is how often outlier penalties are re-evaluated.
	PenaltyInterval time.Duration
	// BodyLimitBytes is Envoy's per-connection buffer limit (the bootstrap's --buffer-limit).
	// With a streamed body the sidecar routes on at most half of it: Envoy stops reading a
	// client whose unanswered body passes the limit. With BUFFERED_PARTIAL, a request whose
	// Content-Length exceeds it is not steered (Envoy could lose the end of such a body), and
	// Envoy's weighted fallback routes it.
	BodyLimitBytes int64
	// MaxRequest bounds request bodies per model (413 above; bodylimit.go).
	MaxRequest RequestLimits
	// HoldTimeout bounds how long a request whose body Envoy streams (STREAMED with
	// send_body_without_waiting_for_header_response) waits for the rest of its body before
	// the sidecar routes on what it has. Keep it under Envoy's ext_proc message_timeout,
	// past which Envoy lets the request through unsteered.
	HoldTimeout time.Duration
	// MaxRequestAge releases in-flight tickets whose outcome never arrived (Envoy's access
	// log entry was lost); it must exceed the longest request.
	MaxRequestAge time.Duration
	// Decisions is how many recent decisions /debug/decisions keeps (0: none).
	Decisions int
	// Tracer, when set, gets one span per decision (spans.go); nil: no spans. The sidecar's
	// --otlp-endpoint sets one that exports over OTLP/gRPC.
	Tracer trace.Tracer
	Log    *slog.Logger
}

// EngineLoadConfig is the sidecar's scrape of its engines' load gauges (vLLM's
// num_requests_running, num_requests_waiting, kv_cache_usage_perc and cache_config_info
// on each engine's /metrics, at the URL the control server publishes with the endpoint). It is the sidecar's view of the work
// other routers hold on each engine: the picker's least-work choice counts it with the
// sidecar's own in-flight work (decide.Core.ObserveEngineLoad); bounded loads do not.
type EngineLoadConfig struct {
	// Interval is how often each engine is scraped; 0 turns the scrape off (the picker
	// then sees only this sidecar's own requests). The llm-d router's endpoint picker
	// refreshes its engines' metrics every 50 ms by default.
	Interval time.Duration `yaml:"scrape_interval"`
	// Timeout bounds one scrape; a failed or late scrape forgets the engine's observed
	// load until the next one succeeds.
	Timeout time.Duration `yaml:"scrape_timeout"`
	// PrefillWeight is how many times more than a token an engine's KV cache holds each
	// prompt token it still has to prefill weighs (decide.Config.PrefillWeight).
	PrefillWeight float64 `yaml:"prefill_weight"`
}

// PriorityConfig says where a request's priority class comes from. Priorities run from 0
// (shed first) to Shed.Priorities-1.
type PriorityConfig struct {
	// Default applies when nothing else names a priority.
	Default int `yaml:"default"`
	// Header, when set, is read as the priority. Only name a header that clients cannot
	// set: the bootstrap strips x-meridian-priority unless told a trusted gateway sets it.
	Header string `yaml:"header"`
	// APIKeys maps the SHA-256 (hex) of a bearer token to a priority.
	APIKeys map[string]int `yaml:"api_keys"`
}

// DefaultConfig is what the sidecar runs with unless configured: DefaultFile built.
func DefaultConfig(log *slog.Logger) Config {
	c, err := DefaultFile().Build(log)
	if err != nil {
		panic(fmt.Sprintf("the sidecar's defaults are invalid: %v", err)) // a programming error
	}
	return c
}

// Core is the decision core's part of c.
func (c Config) Core() decide.Config {
	return decide.Config{Picker: c.Picker, Outliers: c.Outliers, Retry: c.Retry, Shed: c.Shed,
		Fallbacks: c.Picker.Fallbacks, DecodeWork: c.DecodeWork, MoveFactor: c.MoveFactor,
		OverflowEngines: c.OverflowEngines, QuotaAt: c.QuotaAt, PrefillWeight: c.EngineLoad.PrefillWeight,
		PrefixMarks: c.PrefixMarks && c.Request.Marks, MarkTokens: c.markTokens(), Log: c.Log}
}

// markTokens is the prompt tokens one prefix mark stands for (decide.Config.MarkTokens):
// the ladder's first rung in bytes, at decide.BytesPerToken; 0 when requests carry no marks.
func (c Config) markTokens() int64 {
	if !c.Request.Marks || c.Request.KeyBlocks <= 0 {
		return 0
	}
	return int64(c.Request.KeyBlocks * c.Request.BlockBytes / decide.BytesPerToken)
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Validate reports every unusable field. Configurations built from a File were checked
// field by field already; this is the backstop for ones built in code.
func (c Config) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(c.Request.Validate())
	add(c.Core().Validate())
	if c.Request.KeyBlocks < 1 {
		add(fmt.Errorf("request.affinity_blocks must be in [1, request.max_blocks=%d] (got %d)", c.Request.MaxBlocks, c.Request.KeyBlocks))
	}
	add(validatePriority(c.Priority, c.Shed.Priorities))
	add(c.EngineLoad.validate())
	if c.Decisions < 0 {
		add(fmt.Errorf("decisions must be >= 0 (got %d)", c.Decisions))
	}
	if c.SheddableBelow < 0 || c.SheddableBelow > c.Shed.Priorities {
		add(fmt.Errorf("shed.sheddable_below must be in [0, shed.priorities=%d] (got %d)", c.Shed.Priorities, c.SheddableBelow))
	}
	if err := c.MaxRequest.Validate(); err != nil {
		add(fmt.Errorf("request.%w", err))
	}
	if c.BodyLimitBytes < 4096 {
		add(fmt.Errorf("request.body_limit_bytes must be >= 4096 (got %d)", c.BodyLimitBytes))
	}
	for name, d := range map[string]time.Duration{"report_interval": c.ReportInterval, "penalty_interval": c.PenaltyInterval,
		"placements.exchange_interval": c.PlacementInterval, "peers.interval": c.PeerInterval,
		"max_request_age": c.MaxRequestAge, "request.hold_timeout": c.HoldTimeout} {
		if d <= 0 {
			add(fmt.Errorf("%s must be > 0 (got %s)", name, d))
		}
	}
	return errors.Join(errs...)
}

var headerName = regexp.MustCompile(`^[a-z0-9!#$%&'*+.^_|~-]+$`)

func validatePriority(p PriorityConfig, classes int) error {
	var errs []error
	if p.Default < 0 || p.Default >= classes {
		errs = append(errs, fmt.Errorf("priority.default must be in [0, shed.priorities=%d) (got %d)", classes, p.Default))
	}
	if p.Header != "" && !headerName.MatchString(p.Header) {
		errs = append(errs, fmt.Errorf("priority.header %q is not a lowercase HTTP header name", p.Header))
	}
	for k, v := range p.APIKeys {
		if !sha256Hex.MatchString(k) {
			errs = append(errs, fmt.Errorf("priority.api_keys: key %q is not a lowercase hex SHA-256", k))
		}
		if v < 0 || v >= classes {
			errs = append(errs, fmt.Errorf("priority.api_keys[%s]: priority must be in [0, shed.priorities=%d) (got %d)", k, classes, v))
		}
	}
	return errors.Join(errs...)
}

// File is the YAML schema of the sidecar's --config file (docs/configuration.md). The
// pipeline is: DefaultFile (or ReadFile, which decodes strictly over it), flags over it,
// Validate (errors name the YAML path), then Build.
type File struct {
	Request        FileRequest      `yaml:"request"`
	Picker         FilePicker       `yaml:"picker"`
	Outliers       FileOutliers     `yaml:"outliers"`
	Retry          FileRetry        `yaml:"retry"`
	Shed           FileShed         `yaml:"shed"`
	Priority       PriorityConfig   `yaml:"priority"`
	EngineLoad     EngineLoadConfig `yaml:"engine_load"`
	Placements     FilePlacements   `yaml:"placements"`
	Peers          FilePeers        `yaml:"peers"`
	ReportInterval time.Duration    `yaml:"report_interval"`
}

// FilePeers is the file's peers: section.
type FilePeers struct {
	// Interval: how often this sidecar sends its requests in flight, per engine, to each of
	// the node's other sidecars watching it (--peer-listen, --peers).
	Interval time.Duration `yaml:"interval"`
}

// FilePlacements is the file's placements: section.
type FilePlacements struct {
	// ExchangeInterval: how often this sidecar's placements go to the node's other
	// sidecars, through the control server.
	ExchangeInterval time.Duration `yaml:"exchange_interval"`
}

// FileRequest is the file's request: section.
type FileRequest struct {
	BlockBytes     int `yaml:"block_bytes"`
	MaxBlocks      int `yaml:"max_blocks"`
	AffinityBlocks int `yaml:"affinity_blocks"`
	// PrefixMarks prices a move off a key's home by what the destination lacks of the
	// prompt (request.Options.Marks, picker.Prefixes). Off by default: measured on the
	// simulator, it helps prompts that open with a long shared system prompt and costs a
	// search step elsewhere (docs/configuration.md).
	PrefixMarks    bool          `yaml:"prefix_marks"`
	BodyLimitBytes int64         `yaml:"body_limit_bytes"`
	HoldTimeout    time.Duration `yaml:"hold_timeout"`
	// MaxRequestBytes: larger bodies get 413 in OpenAI's shape before any engine sees them.
	MaxRequestBytes RequestLimits `yaml:"max_request_bytes"`
}

// FilePicker is the file's picker: section.
type FilePicker struct {
	Fallbacks int `yaml:"fallbacks"`
	// Choices: how many of a key's engines the least-work choice weighs for its primary
	// (at least fallbacks+1).
	Choices            int     `yaml:"choices"`
	BoundedLoadEpsilon float64 `yaml:"bounded_load_epsilon"`
	MaxInFlight        int64   `yaml:"max_in_flight"`
	// DecodeWorkTokens: bounded loads weigh a request by its body's tokens plus this.
	DecodeWorkTokens int64 `yaml:"decode_work_tokens"`
	// SpillFloor: an engine holding less work than this many short requests'
	// (spill_floor × decode_work_tokens) keeps its keys.
	SpillFloor int64 `yaml:"spill_floor"`
	// MoveFactor: the least-work choice charges a request sent off its key's home this
	// many times its prompt's tokens.
	MoveFactor float64 `yaml:"move_factor"`
	// OverflowAt: a request whose engine's work, with the request's, would pass this
	// fraction of the engine's KV cache goes to an overflow engine that stays under it.
	OverflowAt float64 `yaml:"overflow_at"`
	// OverflowEngines: how many engines outside the node's share, nearest first, are
	// overflow candidates.
	OverflowEngines int `yaml:"overflow_engines"`
	// RoomWait: a key's home without room in its KV cache for the prompt keeps the move
	// cost only while its running requests would free the room within this long.
	RoomWait time.Duration `yaml:"room_wait"`
}

// FileOutliers is the file's outliers: section.
type FileOutliers struct {
	PenaltyRecoverHalfLife time.Duration `yaml:"penalty_recover_half_life"`
}

// FileRetry is the file's retry: section.
type FileRetry struct {
	MaxRetriesIdle uint32  `yaml:"max_retries_idle"`
	GenerousBelow  float64 `yaml:"generous_below"`
	ZeroAt         float64 `yaml:"zero_at"`
	RetryOn        string  `yaml:"retry_on"`
	Ratio          float64 `yaml:"ratio"`
}

// FileShed is the file's shed: section.
type FileShed struct {
	Priorities     int           `yaml:"priorities"`
	RetryAfter     time.Duration `yaml:"retry_after"`
	SheddableBelow int           `yaml:"sheddable_below"`
	QuotaAt        float64       `yaml:"quota_at"`
	// ByWork makes the control server's shed fraction a share of the work, taken from
	// requests in proportion to their work (guard.ShedConfig.ByWork); false: a share of
	// the requests.
	ByWork bool `yaml:"by_work"`
}

// DefaultSpillFloor is the shipped picker.spill_floor: an engine keeps its keys while it
// holds less than six short requests' work (picker.DefaultConfig's floor with the default
// decode_work_tokens).
const DefaultSpillFloor = 6

// DefaultPeerInterval is the shipped peers.interval: a sidecar's peers see its requests
// start and end within 10 ms, where the engines' scrape (50 ms) shows them later
// (docs/results/README.md has what the difference measured).
const DefaultPeerInterval = 10 * time.Millisecond

// Upper bounds of picker fields whose product is a work figure, far above any useful value.
const (
	maxDecodeWorkTokens = 1 << 24
	maxSpillFloor       = 1 << 20
	maxOverflowEngines  = 64
)

// maxMaxBlocks bounds request.max_blocks (a 1 GiB prompt at the default 256-byte block): no
// key ladder needs more, and a mistyped value must not become a limit nothing reaches.
const maxMaxBlocks = 1 << 22

// The placement exchange's bounds: faster than 10 ms only costs CPU, and a placement
// heard after 10 s is past most conversations' next turn.
const (
	minPlacementInterval = 10 * time.Millisecond
	maxPlacementInterval = 10 * time.Second
	// A peer's snapshot is a few dozen bytes per engine; faster than 1 ms is a busy loop,
	// and slower than the engine-load scrape (50 ms) says less than the scrape does.
	minPeerInterval = time.Millisecond
	maxPeerInterval = time.Second
)

// DefaultFile is the sidecar's shipped configuration, as its file would state it.
func DefaultFile() File {
	req, pk, rt, sh := request.DefaultOptions(), picker.DefaultConfig(), guard.DefaultRetryConfig(), guard.DefaultShedConfig()
	return File{
		Request: FileRequest{BlockBytes: req.BlockBytes, MaxBlocks: req.MaxBlocks, AffinityBlocks: req.KeyBlocks,
			BodyLimitBytes: 1 << 20, HoldTimeout: 100 * time.Millisecond,
			MaxRequestBytes: RequestLimits{DefaultBytes: DefaultMaxRequestBytes}},
		Picker: FilePicker{Fallbacks: pk.Fallbacks, Choices: pk.Choices, BoundedLoadEpsilon: pk.Epsilon, MaxInFlight: pk.MaxInFlight,
			DecodeWorkTokens: decide.DefaultDecodeWork, SpillFloor: DefaultSpillFloor, MoveFactor: decide.DefaultMoveFactor,
			OverflowAt: pk.OverflowAt, OverflowEngines: decide.DefaultOverflowEngines, RoomWait: pk.RoomWait},
		// An engine at the minimum factor gets almost no traffic, so its statistics barely
		// move; it must earn its way back by time. 5 s halves the penalty fast enough that a
		// restarted engine is back in use within about 15 s, and a still-broken one is pushed
		// down again within a second of being tried.
		Outliers: FileOutliers{PenaltyRecoverHalfLife: 5 * time.Second},
		Retry: FileRetry{MaxRetriesIdle: rt.Curve.MaxRetriesIdle, GenerousBelow: rt.Curve.GenerousBelow,
			ZeroAt: rt.Curve.ZeroAt, RetryOn: rt.Curve.RetryOn, Ratio: rt.Ratio},
		Shed:           FileShed{Priorities: sh.Priorities, RetryAfter: sh.RetryAfter, QuotaAt: decide.DefaultQuotaAt, ByWork: sh.ByWork},
		Priority:       PriorityConfig{Default: 1, Header: "x-meridian-priority"},
		EngineLoad:     EngineLoadConfig{Interval: 50 * time.Millisecond, Timeout: 500 * time.Millisecond, PrefillWeight: decide.DefaultPrefillWeight},
		Placements:     FilePlacements{ExchangeInterval: 200 * time.Millisecond},
		Peers:          FilePeers{Interval: DefaultPeerInterval},
		ReportInterval: time.Second,
	}
}

// ReadFile decodes the YAML file at path over DefaultFile. Unknown fields are errors, and
// errors name the file. It does not validate: call Build (after applying flags).
func ReadFile(path string) (File, error) {
	f := DefaultFile()
	data, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("read sidecar config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Validate reports every field that is out of range, named by its YAML path. It changes
// nothing.
func (f File) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s", path, fmt.Sprintf(format, args...)))
	}
	r := f.Request
	if r.BlockBytes < 16 {
		bad("request.block_bytes", "is %d: want >= 16", r.BlockBytes)
	}
	if r.MaxBlocks < 1 || r.MaxBlocks > maxMaxBlocks {
		bad("request.max_blocks", "is %d: want 1..%d", r.MaxBlocks, maxMaxBlocks)
	}
	if r.AffinityBlocks < 1 || r.AffinityBlocks > max(r.MaxBlocks, 1) {
		bad("request.affinity_blocks", "is %d: want 1..request.max_blocks (%d)", r.AffinityBlocks, r.MaxBlocks)
	}
	if r.BodyLimitBytes < 4096 {
		bad("request.body_limit_bytes", "is %d: want >= 4096 (Envoy's buffer limit, the bootstrap's --buffer-limit)", r.BodyLimitBytes)
	}
	if r.HoldTimeout <= 0 {
		bad("request.hold_timeout", "is %s: want > 0 (and under Envoy's ext_proc message_timeout)", r.HoldTimeout)
	}
	if err := r.MaxRequestBytes.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("request.%w", err))
	}
	p := f.Picker
	if p.Fallbacks < 0 || p.Fallbacks > picker.MaxExamined-1 {
		bad("picker.fallbacks", "is %d: want 0..%d", p.Fallbacks, picker.MaxExamined-1)
	}
	if p.Choices < p.Fallbacks+1 || p.Choices > picker.MaxExamined {
		bad("picker.choices", "is %d: want %d..%d (at least picker.fallbacks+1)", p.Choices, p.Fallbacks+1, picker.MaxExamined)
	}
	if !(p.BoundedLoadEpsilon > 0) || math.IsInf(p.BoundedLoadEpsilon, 0) {
		bad("picker.bounded_load_epsilon", "is %v: want a finite value > 0", p.BoundedLoadEpsilon)
	}
	if p.MaxInFlight < 0 {
		bad("picker.max_in_flight", "is %d: want >= 0 (0: no cap)", p.MaxInFlight)
	}
	if p.DecodeWorkTokens < 0 || p.DecodeWorkTokens > maxDecodeWorkTokens {
		bad("picker.decode_work_tokens", "is %d: want 0..%d", p.DecodeWorkTokens, maxDecodeWorkTokens)
	}
	if p.SpillFloor < 0 || p.SpillFloor > maxSpillFloor {
		bad("picker.spill_floor", "is %d: want 0..%d (0: none)", p.SpillFloor, maxSpillFloor)
	}
	if !(p.MoveFactor >= 0) || p.MoveFactor > decide.MaxMoveFactor {
		bad("picker.move_factor", "is %v: want 0..%d (0: a move costs nothing)", p.MoveFactor, decide.MaxMoveFactor)
	}
	if !(p.OverflowAt >= 0) || p.OverflowAt > picker.MaxOverflowAt {
		bad("picker.overflow_at", "is %v: want 0..%d (0: no overflow)", p.OverflowAt, picker.MaxOverflowAt)
	}
	if p.RoomWait < 0 || p.RoomWait > picker.MaxRoomWait {
		bad("picker.room_wait", "is %s: want 0s..%s (0s: a home without room keeps its move cost)", p.RoomWait, picker.MaxRoomWait)
	}
	if p.OverflowEngines < 0 || p.OverflowEngines > maxOverflowEngines {
		bad("picker.overflow_engines", "is %d: want 0..%d (0: no overflow)", p.OverflowEngines, maxOverflowEngines)
	}
	if f.Outliers.PenaltyRecoverHalfLife <= 0 {
		bad("outliers.penalty_recover_half_life", "is %s: want > 0", f.Outliers.PenaltyRecoverHalfLife)
	}
	if err := f.retry().Validate(); err != nil {
		errs = append(errs, err)
	}
	s := f.Shed
	if s.Priorities < 1 || s.Priorities > 64 {
		bad("shed.priorities", "is %d: want 1..64", s.Priorities)
	}
	if s.SheddableBelow < 0 || s.SheddableBelow > s.Priorities {
		bad("shed.sheddable_below", "is %d: want 0..shed.priorities (%d)", s.SheddableBelow, s.Priorities)
	}
	if !(s.QuotaAt >= 0) || s.QuotaAt > decide.MaxQuotaAt {
		bad("shed.quota_at", "is %v: want 0..%d (0: the quota sheds any request)", s.QuotaAt, decide.MaxQuotaAt)
	}
	if s.RetryAfter < time.Second || s.RetryAfter%time.Second != 0 {
		bad("shed.retry_after", "is %s: want whole seconds >= 1s (Retry-After has no fractions)", s.RetryAfter)
	}
	if s.Priorities >= 1 {
		if err := validatePriority(f.Priority, s.Priorities); err != nil {
			errs = append(errs, err)
		}
	}
	if err := f.EngineLoad.validate(); err != nil {
		errs = append(errs, err)
	}
	if f.ReportInterval <= 0 {
		bad("report_interval", "is %s: want > 0", f.ReportInterval)
	}
	if i := f.Placements.ExchangeInterval; i < minPlacementInterval || i > maxPlacementInterval {
		bad("placements.exchange_interval", "is %s: want %s..%s", i, minPlacementInterval, maxPlacementInterval)
	}
	if i := f.Peers.Interval; i < minPeerInterval || i > maxPeerInterval {
		bad("peers.interval", "is %s: want %s..%s", i, minPeerInterval, maxPeerInterval)
	}
	return errors.Join(errs...)
}

// The engine-load scrape's bounds: faster than 10 ms is a busy loop against every engine,
// and a view older than 10 s says nothing about a queue.
const (
	minEngineLoadInterval = 10 * time.Millisecond
	maxEngineLoadInterval = 10 * time.Second
)

func (e EngineLoadConfig) validate() error {
	var errs []error
	if e.Interval != 0 && (e.Interval < minEngineLoadInterval || e.Interval > maxEngineLoadInterval) {
		errs = append(errs, fmt.Errorf("engine_load.scrape_interval is %s: want 0 (off) or %s..%s", e.Interval, minEngineLoadInterval, maxEngineLoadInterval))
	}
	if e.Interval != 0 && (e.Timeout <= 0 || e.Timeout > maxEngineLoadInterval) {
		errs = append(errs, fmt.Errorf("engine_load.scrape_timeout is %s: want > 0 and <= %s", e.Timeout, maxEngineLoadInterval))
	}
	if !(e.PrefillWeight >= 0) || e.PrefillWeight > decide.MaxPrefillWeight {
		errs = append(errs, fmt.Errorf("engine_load.prefill_weight is %v: want 0..%d (0: prompts in prefill weigh what they hold)", e.PrefillWeight, decide.MaxPrefillWeight))
	}
	return errors.Join(errs...)
}

func (f File) retry() guard.RetryConfig {
	rc := guard.DefaultRetryConfig()
	rc.Curve.MaxRetriesIdle, rc.Curve.GenerousBelow, rc.Curve.ZeroAt, rc.Curve.RetryOn = f.Retry.MaxRetriesIdle, f.Retry.GenerousBelow, f.Retry.ZeroAt, f.Retry.RetryOn
	rc.Ratio = f.Retry.Ratio
	return rc
}

// Build validates f and returns the configuration it states. Every field of the file is
// applied; nothing is clamped.
func (f File) Build(log *slog.Logger) (Config, error) {
	if err := f.Validate(); err != nil {
		return Config{}, err
	}
	if log == nil {
		return Config{}, errors.New("sidecar config: a logger is required")
	}
	req := request.DefaultOptions()
	req.BlockBytes, req.MaxBlocks, req.KeyBlocks = f.Request.BlockBytes, f.Request.MaxBlocks, f.Request.AffinityBlocks
	req.Marks = true // the core counts what they pin (decide.Config.MarkTokens)
	pk := picker.DefaultConfig()
	pk.Fallbacks, pk.Choices, pk.Epsilon, pk.MaxInFlight = f.Picker.Fallbacks, f.Picker.Choices, f.Picker.BoundedLoadEpsilon, f.Picker.MaxInFlight
	pk.SpillFloor = f.Picker.SpillFloor * max(f.Picker.DecodeWorkTokens, 1)
	pk.OverflowAt, pk.RoomWait = f.Picker.OverflowAt, f.Picker.RoomWait
	pk.MaxExamined = max(pk.MaxExamined, pk.Choices)
	oc := guard.DefaultOutlierConfig()
	oc.RecoverHalfLife = f.Outliers.PenaltyRecoverHalfLife
	sh := guard.DefaultShedConfig()
	sh.Priorities, sh.RetryAfter, sh.ByWork = f.Shed.Priorities, f.Shed.RetryAfter, f.Shed.ByWork
	c := Config{
		Request:           req,
		PrefixMarks:       f.Request.PrefixMarks,
		Picker:            pk,
		DecodeWork:        f.Picker.DecodeWorkTokens,
		MoveFactor:        f.Picker.MoveFactor,
		OverflowEngines:   f.Picker.OverflowEngines,
		QuotaAt:           f.Shed.QuotaAt,
		Outliers:          oc,
		Retry:             f.retry(),
		Shed:              sh,
		SheddableBelow:    f.Shed.SheddableBelow,
		Decisions:         1024,
		Priority:          f.Priority,
		EngineLoad:        f.EngineLoad,
		ReportInterval:    f.ReportInterval,
		PlacementInterval: f.Placements.ExchangeInterval,
		PeerInterval:      f.Peers.Interval,
		PenaltyInterval:   250 * time.Millisecond,
		MaxRequestAge:     15 * time.Minute,
		BodyLimitBytes:    f.Request.BodyLimitBytes,
		HoldTimeout:       f.Request.HoldTimeout,
		MaxRequest:        f.Request.MaxRequestBytes,
		Log:               log,
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// LoadConfig reads, validates and builds the file at path; errors name the file.
func LoadConfig(path string, log *slog.Logger) (Config, error) {
	f, err := ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := f.Build(log)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
