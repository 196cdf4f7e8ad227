package server

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/extproc/decide"
	"github.com/meridian-router/meridian/extproc/picker"
)

// Every field of the sidecar's file is checked, and its error names the YAML path the
// operator wrote, not a Go field.
func TestConfigErrorsNameTheYAMLPath(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"request: {block_bytes: 8}", "request.block_bytes is 8"},
		{"request: {max_blocks: 0}", "request.max_blocks is 0"},
		{"request: {affinity_blocks: 4097}", "request.affinity_blocks is 4097"}, {"request: {max_blocks: 8000000}", "request.max_blocks is 8000000"},
		{"request: {body_limit_bytes: 100}", "request.body_limit_bytes is 100"},
		{"request: {hold_timeout: 0s}", "request.hold_timeout is 0s"},
		{"picker: {fallbacks: -1}", "picker.fallbacks is -1"},
		{"picker: {bounded_load_epsilon: 0}", "picker.bounded_load_epsilon is 0"},
		{"picker: {max_in_flight: -3}", "picker.max_in_flight is -3"},
		{"picker: {decode_work_tokens: -1}", "picker.decode_work_tokens is -1"},
		{"picker: {spill_floor: -2}", "picker.spill_floor is -2"},
		{"picker: {spill_floor: 2000000}", "picker.spill_floor is 2000000"},
		{"picker: {decode_work_tokens: 100000000}", "picker.decode_work_tokens is 100000000"},
		{"outliers: {penalty_recover_half_life: 0s}", "outliers.penalty_recover_half_life is 0s"},
		{"retry: {max_retries_idle: 11}", "retry.max_retries_idle is 11"},
		{"retry: {zero_at: 1.5}", "retry.zero_at 1.5"},
		{"retry: {generous_below: -0.1}", "retry.generous_below -0.1"},
		{"retry: {retry_on: \"\"}", "retry.retry_on is empty"},
		{"retry: {retry_on: \"5xx, reset\"}", "retry.retry_on \"5xx, reset\" has spaces"},
		{"retry: {ratio: 2}", "retry.ratio is 2"},
		{"shed: {priorities: 100}", "shed.priorities is 100"},
		{"shed: {retry_after: 1500ms}", "shed.retry_after is 1.5s"},
		{"shed: {quota_at: -0.5}", "shed.quota_at is -0.5"},
		{"shed: {quota_at: 4.5}", "shed.quota_at is 4.5"},
		{"priority: {default: 9}", "priority.default must be in [0, shed.priorities=4)"},
		{"priority: {header: \"X Bad\"}", "priority.header \"X Bad\""},
		{"priority: {api_keys: {nothex: 1}}", "priority.api_keys: key \"nothex\""},
		{"report_interval: 0s", "report_interval is 0s"},
		{"picker: {move_factor: -1}", "picker.move_factor is -1"},
		{"picker: {move_factor: .nan}", "picker.move_factor is NaN"},
		{"picker: {move_factor: 5000}", "picker.move_factor is 5000"},
		{"picker: {overflow_at: -0.1}", "picker.overflow_at is -0.1"},
		{"picker: {overflow_at: 5}", "picker.overflow_at is 5"},
		{"picker: {overflow_engines: -1}", "picker.overflow_engines is -1"},
		{"picker: {overflow_engines: 65}", "picker.overflow_engines is 65"},
		{"picker: {room_wait: -1s}", "picker.room_wait is -1s"},
		{"picker: {fallbacks: 5, choices: 5}", "picker.choices is 5: want 6..64"},
		{"picker: {choices: 65}", "picker.choices is 65"},
		{"picker: {room_wait: 11m}", "picker.room_wait is 11m0s"},
		{"placements: {exchange_interval: 1ms}", "placements.exchange_interval is 1ms"},
		{"placements: {exchange_interval: 1m}", "placements.exchange_interval is 1m0s"},
		{"peers: {interval: 500us}", "peers.interval is 500µs"},
		{"peers: {interval: 2s}", "peers.interval is 2s"},
		{"engine_load: {scrape_interval: 1ms}", "engine_load.scrape_interval is 1ms"},
		{"engine_load: {scrape_interval: 1m}", "engine_load.scrape_interval is 1m0s"},
		{"engine_load: {scrape_timeout: 0s}", "engine_load.scrape_timeout is 0s"},
		{"engine_load: {prefill_weight: -1}", "engine_load.prefill_weight is -1"},
		{"engine_load: {prefill_weight: 65}", "engine_load.prefill_weight is 65"},
		{"priorities: 4", "field priorities not found"}, // the flat schema of old is refused, not ignored
	} {
		path := filepath.Join(t.TempDir(), "sidecar.yaml")
		if err := os.WriteFile(path, []byte(tc.yaml+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(path, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %v, want one naming %s and %q", tc.yaml, err, path, tc.want)
		}
	}
}

// Every field of the file is applied: each value read back from the built config.
func TestConfigFileIsApplied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sidecar.yaml")
	if err := os.WriteFile(path, []byte(`
request: {block_bytes: 128, max_blocks: 32, affinity_blocks: 8, prefix_marks: true, body_limit_bytes: 65536, hold_timeout: 50ms}
picker: {fallbacks: 3, choices: 9, bounded_load_epsilon: 0.5, max_in_flight: 7, decode_work_tokens: 99, spill_floor: 6, move_factor: 1.5, overflow_at: 0.35, overflow_engines: 3, room_wait: 3s}
outliers: {penalty_recover_half_life: 9s}
retry: {max_retries_idle: 3, generous_below: 0.4, zero_at: 0.8, retry_on: "5xx", ratio: 0.2}
shed: {priorities: 6, retry_after: 2s, quota_at: 0.75, by_work: false}
priority: {default: 5, header: x-tier}
engine_load: {scrape_interval: 200ms, scrape_timeout: 150ms, prefill_weight: 1.5}
placements: {exchange_interval: 400ms}
peers: {interval: 25ms}
report_interval: 3s
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Request.BlockBytes, c.Request.MaxBlocks, c.Request.KeyBlocks, c.BodyLimitBytes, c.HoldTimeout.String(),
		c.Picker.Fallbacks, c.Picker.Epsilon, c.Picker.MaxInFlight, c.DecodeWork, c.Picker.SpillFloor, c.Outliers.RecoverHalfLife.String(),
		c.Retry.Curve.MaxRetriesIdle, c.Retry.Curve.GenerousBelow, c.Retry.Curve.ZeroAt, c.Retry.Curve.RetryOn, c.Retry.Ratio,
		c.Shed.Priorities, c.Shed.RetryAfter.String(), c.Priority.Default, c.Priority.Header, c.ReportInterval.String(),
		c.EngineLoad.Interval.String(), c.EngineLoad.Timeout.String(), c.MoveFactor, c.Core().MoveFactor, c.PlacementInterval.String(),
		c.Picker.OverflowAt, c.Core().OverflowEngines, c.Core().QuotaAt, c.Core().PrefillWeight, c.PeerInterval.String(), c.Request.Marks, c.Core().PrefixMarks, c.Picker.RoomWait.String(),
		c.Picker.Choices, c.Picker.MaxExamined, c.Core().Shed.ByWork, DefaultConfig(slog.New(slog.DiscardHandler)).Core().Shed.ByWork}
	// spill_floor counts short requests: the picker's floor is 6 × decode_work_tokens of work.
	want := []any{128, 32, 8, int64(65536), "50ms", 3, 0.5, int64(7), int64(99), int64(6 * 99), "9s", uint32(3), 0.4, 0.8, "5xx", 0.2, 6, "2s", 5, "x-tier", "3s", "200ms", "150ms", 1.5, 1.5, "400ms", 0.35, 3, 0.75, 1.5, "25ms", true, true, "3s", 9, 16, false, true}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d: got %v, want %v", i, got[i], want[i])
		}
	}
}

// The shipped file gives the decision core the shipped prefill weight: a decide.Config
// built without it would weigh prompts in prefill at 0 and every other test would pass.
func TestDefaultPrefillWeightReachesTheCore(t *testing.T) {
	if got := DefaultConfig(slog.New(slog.DiscardHandler)).Core().PrefillWeight; got != decide.DefaultPrefillWeight {
		t.Fatalf("the sidecar's default core weighs prompts in prefill %v times, want %v", got, decide.DefaultPrefillWeight)
	}
}

// The shipped file's choices are the picker's own default.
func TestDefaultChoicesAreThePickersDefault(t *testing.T) {
	if got := DefaultConfig(slog.New(slog.DiscardHandler)).Picker.Choices; got != picker.DefaultChoices || got <= picker.DefaultFallbacks+1 {
		t.Fatalf("the sidecar's default choices are %d, the picker's %d", got, picker.DefaultChoices)
	}
}

// The shipped file's room_wait is the picker's own default: a sidecar built from the
// defaults waits for room as the picker states it would.
func TestDefaultRoomWaitIsThePickersDefault(t *testing.T) {
	if got := DefaultConfig(slog.New(slog.DiscardHandler)).Picker.RoomWait; got != picker.DefaultRoomWait || got <= 0 {
		t.Fatalf("the sidecar's default room_wait is %s, the picker's %s", got, picker.DefaultRoomWait)
	}
}

// The shipped file's spill_floor (in short requests) gives the picker the floor its own
// default states (in work), so code that starts from picker.DefaultConfig and the sidecar
// agree.
func TestDefaultSpillFloorIsThePickersDefault(t *testing.T) {
	got := DefaultConfig(slog.New(slog.DiscardHandler)).Picker.SpillFloor
	if want := picker.DefaultConfig().SpillFloor; got != want {
		t.Fatalf("the sidecar's default floor is %d work, the picker's %d", got, want)
	}
}

// The shipped file prices no move by prefix marks (request.prefix_marks is an option), but
// the parser takes them always, for the decision core to count what the requests in flight
// pin on their engines (decide.Config.MarkTokens: the ladder's first rung in tokens).
func TestPrefixMarksPriceMovesOnlyWhenAsked(t *testing.T) {
	c, err := DefaultFile().Build(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if c.Core().PrefixMarks || DefaultFile().Request.PrefixMarks {
		t.Errorf("request.prefix_marks is on in the defaults")
	}
	if !c.Request.Marks {
		t.Errorf("the defaults parse no prefix marks: the core cannot count what requests pin")
	}
	if got, want := c.Core().MarkTokens, int64(c.Request.KeyBlocks*c.Request.BlockBytes/decide.BytesPerToken); got != want || got != 1024 {
		t.Errorf("mark tokens %d, want %d (the first rung, 4 KiB, at 4 bytes a token: 1024)", got, want)
	}
	c.Request.Marks = false // a configuration built in code without marks
	if c.Core().MarkTokens != 0 {
		t.Errorf("without marks: mark tokens %d", c.Core().MarkTokens)
	}
}
