package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/extproc/request"
)

// Config configures the sidecar's request handling. Build it with DefaultConfig (and
// optionally LoadConfig), then Validate; New refuses an invalid one.
type Config struct {
	Request request.Options
	// AffinityBlocks picks the routing key: the chained hash after this many prefix blocks
	// (or after the last block of a shorter prompt).
	AffinityBlocks int
	Picker         picker.Config
	Outliers       guard.OutlierConfig
	Retry          guard.RetryConfig
	Shed           guard.ShedConfig
	Priority       PriorityConfig
	// ReportInterval is how often load reports go to the control server.
	ReportInterval time.Duration
	// PenaltyInterval is how often outlier penalties are re-evaluated.
	PenaltyInterval time.Duration
	// BodyLimitBytes is Envoy's per-connection buffer limit (the bootstrap's --buffer-limit).
	// With a streamed body the sidecar routes on at most half of it: Envoy stops reading a
	// client whose unanswered body passes the limit. With BUFFERED_PARTIAL, a request whose
	// Content-Length exceeds it is not steered (Envoy could lose the end of such a body), and
	// Envoy's weighted fallback routes it.
	BodyLimitBytes int64
	// HoldTimeout bounds how long a request whose body Envoy streams (STREAMED with
	// send_body_without_waiting_for_header_response) waits for the rest of its body before
	// the sidecar routes on what it has. Keep it under Envoy's ext_proc message_timeout,
	// past which Envoy lets the request through unsteered.
	HoldTimeout time.Duration
	// MaxRequestAge releases in-flight tickets whose outcome never arrived (Envoy's access
	// log entry was lost); it must exceed the longest request.
	MaxRequestAge time.Duration
	Log           *slog.Logger
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

// DefaultConfig is what the sidecar runs with unless configured.
func DefaultConfig(log *slog.Logger) Config {
	pc := picker.DefaultConfig()
	oc := guard.DefaultOutlierConfig()
	// An engine at the minimum factor gets almost no traffic, so its statistics barely
	// move; it must earn its way back by time. 5 s halves the penalty fast enough that a
	// restarted engine is back in use within about 15 s, and a still-broken one is pushed
	// down again within a second of being tried.
	oc.RecoverHalfLife = 5 * time.Second
	return Config{
		Request:         request.DefaultOptions(),
		AffinityBlocks:  16,
		Picker:          pc,
		Outliers:        oc,
		Retry:           guard.DefaultRetryConfig(),
		Shed:            guard.DefaultShedConfig(),
		Priority:        PriorityConfig{Default: 1, Header: "x-meridian-priority"},
		ReportInterval:  time.Second,
		PenaltyInterval: 250 * time.Millisecond,
		MaxRequestAge:   15 * time.Minute,
		BodyLimitBytes:  1 << 20,
		HoldTimeout:     100 * time.Millisecond,
		Log:             log,
	}
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Validate reports every unusable field.
func (c Config) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(c.Request.Validate())
	add(c.Picker.Validate())
	add(c.Outliers.Validate())
	add(c.Retry.Validate())
	add(c.Shed.Validate())
	if c.AffinityBlocks < 1 || c.AffinityBlocks > c.Request.MaxBlocks {
		add(fmt.Errorf("affinity_blocks must be in [1, max_blocks=%d] (got %d)", c.Request.MaxBlocks, c.AffinityBlocks))
	}
	if c.Priority.Default < 0 || c.Priority.Default >= c.Shed.Priorities {
		add(fmt.Errorf("priority.default must be in [0, %d) (got %d)", c.Shed.Priorities, c.Priority.Default))
	}
	for k, p := range c.Priority.APIKeys {
		if !sha256Hex.MatchString(k) {
			add(fmt.Errorf("priority.api_keys: key %q is not a lowercase hex SHA-256", k))
		}
		if p < 0 || p >= c.Shed.Priorities {
			add(fmt.Errorf("priority.api_keys[%s]: priority must be in [0, %d) (got %d)", k, c.Shed.Priorities, p))
		}
	}
	if c.BodyLimitBytes < 4096 {
		add(fmt.Errorf("body_limit_bytes must be >= 4096 (got %d)", c.BodyLimitBytes))
	}
	for name, d := range map[string]time.Duration{"report_interval": c.ReportInterval, "penalty_interval": c.PenaltyInterval, "max_request_age": c.MaxRequestAge, "hold_timeout": c.HoldTimeout} {
		if d <= 0 {
			add(fmt.Errorf("%s must be > 0 (got %s)", name, d))
		}
	}
	if c.Log == nil {
		add(errors.New("a logger is required"))
	}
	return errors.Join(errs...)
}

// fileConfig is the YAML schema of the sidecar's --config file (docs/configuration.md).
// Absent fields keep their defaults.
type fileConfig struct {
	BlockBytes      *int            `yaml:"block_bytes"`
	MaxBlocks       *int            `yaml:"max_blocks"`
	AffinityBlocks  *int            `yaml:"affinity_blocks"`
	Fallbacks       *int            `yaml:"fallbacks"`
	Epsilon         *float64        `yaml:"bounded_load_epsilon"`
	MaxInFlight     *int64          `yaml:"max_in_flight"`
	ReportInterval  *time.Duration  `yaml:"report_interval"`
	PenaltyRecovery *time.Duration  `yaml:"penalty_recover_half_life"`
	Retry           *fileRetry      `yaml:"retry"`
	Priorities      *int            `yaml:"priorities"`
	RetryAfter      *time.Duration  `yaml:"retry_after"`
	Priority        *PriorityConfig `yaml:"priority"`
	BodyLimitBytes  *int64          `yaml:"body_limit_bytes"`
	HoldTimeout     *time.Duration  `yaml:"hold_timeout"`
}

type fileRetry struct {
	MaxRetriesIdle *uint32  `yaml:"max_retries_idle"`
	GenerousBelow  *float64 `yaml:"generous_below"`
	ZeroAt         *float64 `yaml:"zero_at"`
	RetryOn        *string  `yaml:"retry_on"`
	Ratio          *float64 `yaml:"ratio"`
}

// LoadConfig applies the YAML file at path over c. Unknown fields are errors, and errors
// name the file.
func LoadConfig(path string, c Config) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read sidecar config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f fileConfig
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	set(&c.Request.BlockBytes, f.BlockBytes)
	set(&c.Request.MaxBlocks, f.MaxBlocks)
	set(&c.AffinityBlocks, f.AffinityBlocks)
	set(&c.Picker.Fallbacks, f.Fallbacks)
	set(&c.Picker.Epsilon, f.Epsilon)
	set(&c.Picker.MaxInFlight, f.MaxInFlight)
	set(&c.ReportInterval, f.ReportInterval)
	set(&c.Outliers.RecoverHalfLife, f.PenaltyRecovery)
	set(&c.Shed.Priorities, f.Priorities)
	set(&c.Shed.RetryAfter, f.RetryAfter)
	if r := f.Retry; r != nil {
		set(&c.Retry.Curve.MaxRetriesIdle, r.MaxRetriesIdle)
		set(&c.Retry.Curve.GenerousBelow, r.GenerousBelow)
		set(&c.Retry.Curve.ZeroAt, r.ZeroAt)
		set(&c.Retry.Curve.RetryOn, r.RetryOn)
		set(&c.Retry.Ratio, r.Ratio)
	}
	set(&c.BodyLimitBytes, f.BodyLimitBytes)
	set(&c.HoldTimeout, f.HoldTimeout)
	if f.Priority != nil {
		c.Priority = *f.Priority
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func set[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}
