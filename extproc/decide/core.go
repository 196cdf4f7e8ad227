package decide

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/policy"
	"github.com/meridian-router/meridian/xdsapi"
)

// Config configures a Core. Build it from the sidecar's configuration; Validate names
// fields by the sidecar's YAML paths.
type Config struct {
	Picker   picker.Config
	Outliers guard.OutlierConfig
	Retry    guard.RetryConfig
	Shed     guard.ShedConfig
	// Fallbacks is how many engines after the primary the destination list carries at most
	// (Envoy retries down it), counting failover engines.
	Fallbacks int
	// DecodeWork is the work, in prompt-token equivalents, charged to an engine for a
	// request's decode on top of its prompt's tokens: bounded loads weigh a request by
	// Request.BodyBytes/BytesPerToken + DecodeWork. See DefaultDecodeWork.
	DecodeWork int64
	// MoveFactor prices a move in the least-work choice: a request sent to an engine other
	// than its key's home (the engine the node's sidecars last sent the key to) is charged
	// MoveFactor × its prompt tokens, the prefill it redoes there and the context it leaves
	// behind for the key's next turns. A key no sidecar has placed is charged nothing: it
	// has no cache to lose, so it goes where the least work is. See DefaultMoveFactor.
	MoveFactor float64
	// OverflowEngines is how many engines the node gives no share (EDS priority 1, the
	// nearest first) may take a request that the engine the picker chose would queue
	// (picker.Config.OverflowAt); the sidecar scrapes their load gauges too. 0: none.
	// See DefaultOverflowEngines.
	OverflowEngines int
	// QuotaAt holds the control server's shed fraction back from requests whose engine has
	// room: a request is shed by the quota (ShedQuota) only when the engine its pick chose
	// would hold, with it, more work than QuotaAt of its KV cache (picker.Table.CacheFill;
	// the fraction picker.Config.OverflowAt compares), or held requests waiting at its last
	// scrape (an engine whose batch is full of sequences queues with its cache nearly
	// empty). The plan sheds what its smoothed demand puts above the fleet's capacity,
	// bursts included; the engines' own load says whether this request is part of what
	// they cannot hold. A request whose engine states no KV cache is shed as the quota
	// says. 0: the quota applies to every request. See DefaultQuotaAt.
	QuotaAt float64
	// PrefillWeight is how many times more than a token an engine's KV cache holds each
	// token it still has to prefill weighs in the core's view of that engine's work (the
	// prompts it has scheduled and not yet answered, less the share of them its prefix
	// cache serves; see ObserveEngineLoad). A token in prefill delays every request that
	// arrives behind it by its whole prefill, where a token held by a decoding request
	// only slows the engine's steps. 0: prompts in prefill weigh what they hold. See
	// DefaultPrefillWeight.
	PrefillWeight float64
	// PrefixMarks keeps a memory of the prefix marks requests carry (Request.Marks,
	// picker.Prefixes: prefixSlots, 4 MiB), so that a move is charged by what the
	// destination lacks of the prompt; false: requests' marks are ignored and no memory is
	// kept. The sidecar's request.prefix_marks sets it with the parser's marks.
	PrefixMarks bool
	// MarkTokens is the prompt tokens one of a request's prefix marks (Request.Marks)
	// stands for. When positive, the core counts the marks of its requests in flight as
	// pinned on their engines (picker.Pins: pinSlots, 4 MiB), and a candidate's room for a
	// prompt leaves out the part of it those requests pin there; 0: every prompt needs room
	// whole. The sidecar sets it from its parser's options.
	MarkTokens int64
	// Rankings, when set, is shared by cores that are given the same views in one process
	// (the simulator's replicas of a node's sidecar), so that each set of endpoints is
	// ranked once; the tables are the same either way (picker.Rankings). nil: each core
	// ranks its own.
	Rankings *picker.Rankings
	// Log receives the core's warnings; required.
	Log *slog.Logger
	// OnEngineOutcome, when set, is told every engine outcome the core learns (for metrics).
	// It runs on the outcome path and must not block.
	OnEngineOutcome func(engine string, ok bool)
}

// Validate reports every unusable field.
func (c Config) Validate() error {
	var errs []error
	for _, err := range []error{c.Picker.Validate(), c.Outliers.Validate(), c.Retry.Validate(), c.Shed.Validate()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.Fallbacks < 0 {
		errs = append(errs, fmt.Errorf("fallbacks is %d: want >= 0", c.Fallbacks))
	}
	if c.DecodeWork < 0 {
		errs = append(errs, fmt.Errorf("decode work is %d: want >= 0", c.DecodeWork))
	}
	if !(c.MoveFactor >= 0) || c.MoveFactor > MaxMoveFactor {
		errs = append(errs, fmt.Errorf("move factor is %v: want 0..%v", c.MoveFactor, MaxMoveFactor))
	}
	if !(c.QuotaAt >= 0) || c.QuotaAt > MaxQuotaAt {
		errs = append(errs, fmt.Errorf("quota at is %v: want 0..%v (0: the quota sheds any request)", c.QuotaAt, MaxQuotaAt))
	}
	if !(c.PrefillWeight >= 0) || c.PrefillWeight > MaxPrefillWeight {
		errs = append(errs, fmt.Errorf("prefill weight is %v: want 0..%v", c.PrefillWeight, MaxPrefillWeight))
	}
	if c.MarkTokens < 0 {
		errs = append(errs, fmt.Errorf("mark tokens is %d: want >= 0 (0: no pins)", c.MarkTokens))
	}
	if c.OverflowEngines < 0 || c.OverflowEngines > maxOverflowEngines {
		errs = append(errs, fmt.Errorf("overflow engines is %d: want 0..%d", c.OverflowEngines, maxOverflowEngines))
	}
	if c.Log == nil {
		errs = append(errs, errors.New("decide: a logger is required"))
	}
	return errors.Join(errs...)
}

// Core is the sidecar's decision logic without a transport: the ext_proc server and the
// simulator both drive it. See the package doc for its state and how each piece is
// synchronized.
type Core struct {
	cfg      Config
	clock    guard.Clock
	loads    *picker.Loads
	outliers *guard.Outliers
	retries  *guard.Retries
	shedder  *guard.Shedder
	tickets  *tickets

	routing atomic.Pointer[routing]
	// plannedUtil is the control server's utilization estimate for this node (float64 bits).
	plannedUtil atomic.Uint64
	// steeredSinceOutcome counts requests steered since an outcome last came, and
	// lastOutcome (unix nanos) is when: together they tell a missing access log.
	steeredSinceOutcome atomic.Int64
	lastOutcome         atomic.Int64

	rebuildMu sync.Mutex // serializes routing rebuilds (off the request path)
	statesMu  sync.Mutex // guards states (off the request path: routing snapshots hold the pointers)
	states    map[string]*modelState
	window    atomic.Int64 // unix nanos at which the current report window began
	// tablesBuilt counts the picker tables built, by cause (causeView, causePenalties).
	tablesBuilt [2]atomic.Int64
	// routedN and routedWork count the requests this core steered and their work; meanMu
	// guards meanWork, the mean work of recent ones (see requestWork), and the counts it
	// last read.
	routedN, routedWork atomic.Int64
	meanMu              sync.Mutex
	meanWork            float64
	meanN, meanW        int64
	// homes remembers each key's last engine (picker.Homes), its own and its peers'
	// (AdoptPlacements): the least-work choice keeps a conversation where its newest
	// context went. drained is the journal cursor of AppendPlacements, under drainMu.
	homes *picker.Homes
	// prefixes remembers which prompt prefixes this core sent to which engine
	// (picker.Prefixes), for the move cost of requests that carry marks; nil without
	// Config.PrefixMarks (Place and PickFor then ignore the marks).
	prefixes *picker.Prefixes
	// pins counts the prefix marks of this core's requests in flight on each engine
	// (picker.Pins), for the room a prompt needs there; nil without Config.MarkTokens.
	pins    *picker.Pins
	drainMu sync.Mutex
	drained uint64
	// started is when the core was made (homeWarmup counts from it).
	started time.Time
	// caches is what the core's first look at each engine's KV-cache counters said
	// (cachesUnknown, cachesCold, cachesWarm); firstLooks, under firstLooksMu, lists the
	// engines looked at. ObserveEngineLoad writes them, off the request path.
	caches       atomic.Int32
	firstLooksMu sync.Mutex
	firstLooks   map[string]struct{}
	// counters, under countersMu, is what ObserveEngineLoad keeps of each engine's
	// counters between scrapes (engineCounters), off the request path.
	countersMu sync.Mutex
	counters   map[string]*engineCounters
	// peers, under peersMu, is what each of the node's other sidecars last sent of its
	// requests in flight (SetPeerInFlight), and peerSum their sum per engine address; the
	// picker's counters hold the work (picker.Loads.SetPeers). Off the request path.
	peersMu sync.Mutex
	peers   map[string]peerInFlight
	peerSum map[string]EngineInFlight
}

// engineCounters is what the core keeps of an engine's counters between scrapes: its
// prefix-cache counters (inPrefill) and its finished requests (finishRate).
type engineCounters struct {
	// base is the engine's Load.InPrefill when it was last seen idle.
	base float64
	// queries and hits are its prefix-cache counters at the last scrape that stated them
	// (counted), and hitRate the share of the prompt tokens it looked up that its cache
	// served, smoothed over scrapes once rated (the first share measured is taken as it is).
	queries, hits, hitRate float64
	counted, rated         bool
	// finished is Load.Finished at the last scrape that stated it, at (zero before one
	// did); rate the requests it finishes per second, smoothed over finishWindow; alpha
	// the smoothing weight of a scrape dt after the one before, kept for the next scrape
	// at the same interval.
	finished, rate, dt, alpha float64
	at                        time.Time
}

// What the engines' KV caches held when the core started, as its first look at each
// engine's counters (Load.KVWritten) tells: unknown before any engine stated them, cold
// while every engine looked at had written nothing into its cache, warm once one had.
const (
	cachesUnknown int32 = iota
	cachesCold
	cachesWarm
)

// homeWarmup is how long a new core takes a key it has no home for to be at home on the
// key's first engine instead of placing it freely: a sidecar that restarts has forgotten
// its homes, and its node's conversations come back within a minute or two; their caches
// are on the engines the key order gave them, before the restart as after. It does not
// apply when the engines' caches were empty as the core started (every engine's first
// scrape shows no more written into its KV cache than this core has routed by then: a
// fleet that starts, or engines that restarted too), where nothing can be at home
// anywhere. When a node's sidecars all start with a fleet and one scrapes an engine only
// after the others' requests have filled it past its own, it takes the caches for warm and
// keeps unknown keys on their first engines for that minute.
const homeWarmup = time.Minute

// warmingUp reports whether an unknown key is taken to be at home on its first engine
// (homeWarmup).
func (c *Core) warmingUp(now time.Time) bool {
	return now.Sub(c.started) < homeWarmup && c.caches.Load() != cachesCold
}

// DefaultMoveFactor is the shipped Config.MoveFactor: a conversation stays with its
// cache until its home holds sixteen prompts' worth more work than the least loaded of its
// other engines (sticky until busy), or until its home is far from room in its KV cache
// for the prompt (the picker then caps the move cost at the prompt: its package doc's
// Room). On the simulator (docs/results/README.md) 3 prompts
// kept more conversations with their cache than one at the same balance, and 6 to 10
// measured alike. Since the engines' prompts in prefill weigh in their work
// (ObserveEngineLoad), a busy home shows sooner, and 16 against 6 kept capacity level or
// higher on every trace and GPU with a higher KV hit rate (Mooncake H100 at its capacity
// 0.36 against 0.31), at 0.2-0.4 points of SLO attainment near capacity on A100 engines.
const DefaultMoveFactor = 16

// MaxMoveFactor bounds Config.MoveFactor far above any useful value.
const MaxMoveFactor = 1000

// DefaultOverflowEngines is the shipped Config.OverflowEngines: the engines of two more
// regions of four, which the simulator's fleet has (docs/results/README.md has what
// overflow measured there).
const DefaultOverflowEngines = 8

// DefaultQuotaAt is the shipped Config.QuotaAt: the control server's shed quota applies
// once the request's engine would hold half its KV cache in work, two and a half times
// the point where requests overflow to other regions' engines (picker.DefaultOverflowAt).
// On the simulator (docs/results/README.md) 0.45 to 0.55 measured alike and above 0.3,
// 0.65 and no hold on Azure's bursty arrivals, and level on Mooncake's.
const DefaultQuotaAt = 0.5

// DefaultPrefillWeight is the shipped Config.PrefillWeight. On the simulator
// (docs/results/README.md) 3 raised the capacity at the SLO with A100 engines by a search
// step or two and left Azure's level, against 1 (the weight before the setting existed,
// without the prefix cache's share taken off).
const DefaultPrefillWeight = 3

// MaxPrefillWeight bounds Config.PrefillWeight far above any useful value.
const MaxPrefillWeight = 64

// MaxQuotaAt bounds Config.QuotaAt: past a few caches' worth of work an engine has queued
// its requests for many seconds.
const MaxQuotaAt = 4

// maxOverflowEngines bounds Config.OverflowEngines: each is scraped by every sidecar.
const maxOverflowEngines = 64

// homeSlots is the size of a core's key memory: 8 bytes a slot, 512 KiB in all; keys
// beyond it share slots and, on a collision, fall back to the key's order.
const homeSlots = 1 << 16

// prefixSlots is the size of a core's prefix memory (picker.Prefixes): 16 bytes a slot,
// 4 MiB in all, the marks of 4,096 prompts of 64 marks (256 KiB each at 4 KiB a mark).
const prefixSlots = 1 << 18

// pinSlots is the size of a core's memory of the marks its requests in flight pin
// (picker.Pins): 8 bytes a slot, 4 MiB in all. A request counts its marks at sampled
// depths (24 of a 512 KiB prompt's 128 marks), each in a word for its engine and one for
// any engine: 1,024 such requests in flight fill under a tenth of it. A mark that finds
// both its slots taken is not counted, nor are the prompt's marks after it: the request is
// judged to pin less than it does.
const pinSlots = 1 << 19

// modelState is what the request path keeps per model across snapshots: arrival counters
// for the load report and the model's shedder.
type modelState struct {
	requests    atomic.Int64
	promptBytes atomic.Int64
	shed        guard.ModelShedder
}

// New returns a core that routes nothing until the first Update.
func New(cfg Config, clock guard.Clock) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		return nil, errors.New("decide: a clock is required (guard.SystemClock in production)")
	}
	c := &Core{cfg: cfg, clock: clock, loads: picker.NewLoads(), tickets: newTickets(), states: map[string]*modelState{},
		homes: picker.NewHomes(homeSlots)}
	if cfg.PrefixMarks {
		c.prefixes = picker.NewPrefixes(prefixSlots)
	}
	if cfg.MarkTokens > 0 {
		c.pins = picker.NewPins(pinSlots)
	}
	var err error
	if c.outliers, err = guard.NewOutliers(cfg.Outliers, clock); err != nil {
		return nil, err
	}
	if c.retries, err = guard.NewRetries(cfg.Retry); err != nil {
		return nil, err
	}
	if c.shedder, err = guard.NewShedder(cfg.Shed, clock); err != nil {
		return nil, err
	}
	c.started = clock.Now()
	now := c.started.UnixNano()
	c.window.Store(now)
	c.lastOutcome.Store(now)
	return c, nil
}

// state returns the model's long-lived state, creating it.
func (c *Core) state(model string) *modelState {
	c.statesMu.Lock()
	defer c.statesMu.Unlock()
	st := c.states[model]
	if st == nil {
		st = &modelState{shed: c.shedder.Model(model)}
		c.states[model] = st
	}
	return st
}

// Update swaps in a routing snapshot built from the node's xDS view (the published
// weights times the current penalties). A view that cannot be built is refused and the
// current snapshot stays.
func (c *Core) Update(v *xdsapi.View) error {
	c.rebuildMu.Lock()
	defer c.rebuildMu.Unlock()
	return c.rebuildLocked(v, c.outliers.Penalties(), causeView)
}

// Causes of a routing rebuild, the index of tablesBuilt.
const (
	causeView = iota
	causePenalties
)

// rebuildLocked builds and swaps in a snapshot; the caller holds rebuildMu, and read the
// view or the penalties it passes under it, so a rebuild for one never undoes the other.
func (c *Core) rebuildLocked(v *xdsapi.View, pen *guard.Penalties, cause int) error {
	r, built, err := newRouting(v, pen, c.cfg.Picker, c.cfg.OverflowEngines, c.cfg.Rankings, c.loads, c.state, c.routing.Load())
	c.tablesBuilt[cause].Add(int64(built))
	if err != nil {
		return err
	}
	c.routing.Store(r)
	return nil
}

// TablesBuilt reports how many picker tables the core has built for new views (EDS
// updates) and for new penalties. Each costs tens of milliseconds of CPU at the default
// size; a model whose endpoints and weights did not change keeps its table.
func (c *Core) TablesBuilt() (view, penalties int64) {
	return c.tablesBuilt[causeView].Load(), c.tablesBuilt[causePenalties].Load()
}

// Ready reports whether the core has a routing snapshot.
func (c *Core) Ready() bool { return c.routing.Load() != nil }

// RefreshPenalties re-evaluates outliers and rebuilds the snapshot when a published factor
// changed (at most once per Config.Outliers.PublishInterval, and only the tables of the
// models the changed engines serve); it returns the engines now penalized (nil when
// nothing changed).
func (c *Core) RefreshPenalties() ([]guard.EngineStatus, error) {
	p := c.outliers.Evaluate()
	c.rebuildMu.Lock()
	defer c.rebuildMu.Unlock()
	r := c.routing.Load()
	if r == nil || p.Version == r.penalties {
		return nil, nil
	}
	if err := c.rebuildLocked(r.view, p, causePenalties); err != nil {
		return nil, fmt.Errorf("rebuild with new penalties: %w", err)
	}
	var out []guard.EngineStatus
	for _, e := range p.Engines() {
		if e.Factor < 1 {
			out = append(out, e)
		}
	}
	return out, nil
}

// Expire releases the tickets of requests started more than age ago whose outcome never
// came, and returns how many it released.
func (c *Core) Expire(age time.Duration) int {
	return c.tickets.expire(c.clock.Now().Add(-age))
}

// OutcomeSilence reports how many requests were steered since an outcome last came, and
// how long ago that was.
func (c *Core) OutcomeSilence() (steered int64, since time.Duration) {
	return c.steeredSinceOutcome.Load(), c.clock.Now().Sub(time.Unix(0, c.lastOutcome.Load()))
}

// Request is what the core needs of one parsed request.
type Request struct {
	Model string
	// Key is the prefix key: requests that share it share a prompt prefix.
	Key uint64
	// ParentKey, when not 0, is the key one rung up the key ladder (request.KeyDepth): a
	// key with no home yet takes its parent's, since the conversation whose previous turn
	// was placed under the parent has its context there.
	ParentKey uint64
	// Marks are the prompt's prefix marks (extproc/request's Marks: the chained hash after
	// every KeyBlocks blocks), from the first: with Config.MarkTokens the core counts them
	// as pinned on the engine while the request runs, and a candidate's room for a prompt
	// leaves out what its pins cover (picker.Pins); with Config.PrefixMarks a candidate
	// that is not the key's home is charged the move cost for the share of them it is not
	// known to hold (picker.Prefixes), where without them it is charged all of it.
	// Optional.
	Marks    []uint64
	Priority int
	// PromptBytes is the canonical prompt's size, for the reported token rate.
	PromptBytes int
	// BodyBytes is the request body's size (its Content-Length, or the bytes seen when
	// it has none): with Config.DecodeWork, the request's weight in bounded loads.
	BodyBytes int
	// RequestID is the proxy's own request id (never the client's), the outcome's key of
	// last resort. Optional.
	RequestID string
	// Subset, when HasSubset, lists the only endpoints (ip:port) the request may go to: a
	// Gateway API Inference Extension gateway's subset hint. An empty one allows none.
	Subset    []string
	HasSubset bool
}

// Verdict is what the core decided for a request.
type Verdict uint8

const (
	// Steer: send it to Decision's engines, in order.
	Steer Verdict = iota
	// NoSnapshot: nothing to route on yet; let the proxy's own balancing take it.
	NoSnapshot
	// UnknownModel: no cluster serves the model (404).
	UnknownModel
	// NoEngine: the model has no engine this node may use (503).
	NoEngine
	// ShedQuota: shed by the control server's fraction for the model (503).
	ShedQuota
	// ShedLimit: shed because every candidate is at its local limit (503).
	ShedLimit
)

var verdictNames = [...]string{Steer: "steered", NoSnapshot: "pass_through", UnknownModel: "unknown_model",
	NoEngine: "no_engine", ShedQuota: "shed_quota", ShedLimit: "shed_limit"}

// String is the verdict as the sidecar's metrics label it.
func (v Verdict) String() string { return verdictNames[v] }

// Shed reports whether the verdict sheds the request.
func (v Verdict) Shed() bool { return v == ShedQuota || v == ShedLimit }

// RetryOnUnsent are Envoy's retry conditions for requests no engine started on: with no
// budget left, such a request may still move once, which adds no load to any engine.
const RetryOnUnsent = "connect-failure,refused-stream"

// Decision is the core's answer for one request.
type Decision struct {
	Verdict Verdict
	// Model and Cluster name the model and its Envoy cluster (set from UnknownModel on).
	Model, Cluster string
	// Order lists the picked engines, best first, as indices of the model's table; it is
	// backed by the buffer given to Route. Set for Steer.
	Order []int
	// Engine is the primary's name. Set for Steer.
	Engine string
	// Retries and RetryOn are x-envoy-max-retries and x-envoy-retry-on; Budget is what the
	// retry budget granted (Retries is 1 with RetryOnUnsent when it granted nothing).
	Retries uint32
	RetryOn string
	Budget  uint32
	// Ticket identifies the request's in-flight count; the outcome brings it back. Empty
	// when the request was not tracked (its outcome had already come).
	Ticket string
	// Spilled is set when the primary is not the key's first engine because of load.
	Spilled bool
	// Overflowed is set when the primary is an engine the node gives no share: the
	// engines with a share would have queued the request (picker.Config.OverflowAt).
	Overflowed bool
	// QuotaHeld is set when the control server asks to shed a share of the model's
	// requests and this one was admitted because its engine had room (Config.QuotaAt).
	QuotaHeld bool
	// Priority is the request's class, clamped to the configured classes.
	Priority int
	// RetryAfter is the wait a shed answer asks for.
	RetryAfter time.Duration

	route     *modelRoute
	fallbacks int
}

// Route decides one request. buf backs Decision.Order (picker.MaxExamined is enough), so
// a caller that passes a stack array routes without allocating for the order.
func (c *Core) Route(req Request, buf []int) Decision {
	rt := c.routing.Load()
	if rt == nil {
		return Decision{Verdict: NoSnapshot}
	}
	m, ok := rt.models[req.Model]
	if !ok {
		return Decision{Verdict: UnknownModel, Model: req.Model}
	}
	d := Decision{Model: m.name, Cluster: m.cluster, route: m, fallbacks: c.cfg.Fallbacks,
		Priority: min(max(req.Priority, 0), c.cfg.Shed.Priorities-1)}
	m.state.requests.Add(1)
	m.state.promptBytes.Add(int64(req.PromptBytes))
	if m.table.Len() == 0 {
		d.Verdict, d.RetryAfter = NoEngine, c.cfg.Shed.RetryAfter
		return d
	}
	// An engine other than the key's home must redo the prompt's prefill and leaves the
	// key's context behind: the least-work choice charges it MoveFactor prompts. A key no
	// sidecar of the node has placed has nothing cached to lose and moves for free, except
	// while the core is new (homeWarmup): then an unknown key may be one placed before a
	// restart, and is taken to be at home on its first engine, where every sidecar's key
	// order put it. A key with no home whose parent (Request.ParentKey) has one is at home
	// there: its prompt crossed a rung of the key ladder since its previous turn.
	now := c.clock.Now()
	prompt := int64(req.BodyBytes / BytesPerToken)
	work := prompt + c.cfg.DecodeWork
	home, move := c.homes.Lookup(req.Key, m.table), int64(0)
	if home < 0 && req.ParentKey != 0 {
		home = c.homes.Lookup(req.ParentKey, m.table)
	}
	if home >= 0 || c.warmingUp(now) {
		move = int64(c.cfg.MoveFactor * float64(prompt))
	}
	res := m.table.PickFor(&picker.Ask{Key: req.Key, Work: work, Move: move, Home: home,
		Prefixes: c.prefixes, Marks: req.Marks, Prompt: prompt, Pins: c.pins, MarkTokens: c.cfg.MarkTokens}, buf[:0])
	if req.HasSubset {
		var ok bool
		if res, ok = restrict(m.table, req.Key, res, req.Subset); !ok {
			d.Verdict, d.RetryAfter = NoEngine, c.cfg.Shed.RetryAfter
			return d
		}
		d.fallbacks = len(res.Order) - 1 // failover engines outside the subset are not listed
	}
	atLimit := res.AtLimit || c.reserved(m.table, res.Order, d.Priority)
	sd := m.state.shed.Decide(d.Priority, atLimit, c.queued(m.table, res.Order, work), float64(work))
	if sd.Shed() {
		d.Verdict, d.RetryAfter = ShedQuota, sd.RetryAfter
		if sd.Reason == guard.ShedLimit {
			d.Verdict = ShedLimit
		}
		return d
	}
	d.Order, d.Spilled, d.Overflowed, d.QuotaHeld = res.Order, res.Spilled, res.Overflowed, sd.Held
	primary := res.Order[0]
	ep := m.table.Endpoint(primary)
	d.Engine = ep.Engine
	grant := c.retries.Allow(c.utilization(m.table))
	d.Budget, d.Retries, d.RetryOn = grant.Max, grant.Max, grant.RetryOn
	if grant.Max == 0 {
		d.Retries, d.RetryOn = 1, RetryOnUnsent
	}
	c.homes.Remember(req.Key, m.table, primary)
	c.prefixes.Place(m.table, primary, req.Marks)
	c.routedN.Add(1)
	c.routedWork.Add(work)
	id := c.tickets.next()
	tk := m.table.Start(primary, work)
	c.pins.Pin(m.table, primary, req.Marks, &tk)
	if c.tickets.put(id, inflight{ticket: tk, engine: ep.Engine, address: ep.Address, model: m.name,
		start: now, requestID: req.RequestID}) {
		d.Ticket = id
	}
	c.steeredSinceOutcome.Add(1)
	return d
}

// AppendDestination appends the decision's endpoint list ("ip:port,ip:port"): the picked
// engines, then failover engines, at most 1 + Fallbacks in all.
func (d *Decision) AppendDestination(dst []byte) []byte {
	dst = d.route.table.AppendAddrs(dst, d.Order)
	for f := range d.failovers {
		dst = append(append(dst, ','), f.address...)
	}
	return dst
}

// AppendEngines appends the names of the engines AppendDestination lists, in its order.
func (d *Decision) AppendEngines(dst []string) []string {
	for _, i := range d.Order {
		dst = append(dst, d.route.table.Endpoint(i).Engine)
	}
	for f := range d.failovers {
		dst = append(dst, f.engine)
	}
	return dst
}

// failovers yields the failover engines the destination lists after the picked ones, up
// to 1 + Fallbacks engines in all; an overflow primary, a failover engine too, is not
// listed twice.
func (d *Decision) failovers(yield func(failover) bool) {
	n := len(d.Order)
	for _, f := range d.route.failover {
		if n >= 1+d.fallbacks {
			return
		}
		if d.Overflowed && d.route.table.Endpoint(d.Order[0]).Address == f.address {
			continue
		}
		if !yield(f) {
			return
		}
		n++
	}
}

// EndStream tells the core that a request's proxy stream closed while its request may
// still run: its in-flight count is released, and its ticket waits for the outcome.
func (c *Core) EndStream(ticket string) {
	if ticket != "" {
		c.tickets.end(ticket)
	}
}

// queued reports whether the control server's shed quota may take the request: its
// primary held requests waiting (not scheduled into its batch) at the last scrape, or
// would hold more than Config.QuotaAt of its KV cache in work, or states no cache; or
// QuotaAt is 0.
func (c *Core) queued(t *picker.Table, order []int, work int64) bool {
	if c.cfg.QuotaAt <= 0 || len(order) == 0 {
		return true
	}
	if t.Waiting(order[0]) > 0 {
		return true
	}
	fill, ok := t.CacheFill(order[0], work)
	return !ok || fill > c.cfg.QuotaAt
}

// reservedShare is the part of every capped engine's in-flight cap held back from the
// lowest priority, shrinking linearly to nothing for the highest: as engines fill up,
// low-priority requests meet their local limit first and the last slots stay for the
// important ones.
const reservedShare = 0.2

// reserved reports whether every candidate is past the share of its cap that priority p
// may use. Engines without a cap never are.
func (c *Core) reserved(t *picker.Table, order []int, p int) bool {
	top := c.cfg.Shed.Priorities - 1
	if p >= top || len(order) == 0 {
		return false
	}
	share := 1 - reservedShare*float64(top-p)/float64(top)
	for _, i := range order {
		limit, ok := t.Limit(i)
		if !ok || float64(t.InFlight(i)) < share*float64(limit) {
			return false
		}
	}
	return true
}

// utilization is the larger of what the control server planned for this node and what the
// core measures locally against hard in-flight caps (when every engine has one).
func (c *Core) utilization(t *picker.Table) float64 {
	u := math.Float64frombits(c.plannedUtil.Load())
	if local, ok := t.Utilization(); ok && local > u {
		u = local
	}
	return u
}

// Outcome ends the request's ticket and feeds the guards: it is called with every
// completed request the proxy reports (Envoy's access log).
func (c *Core) Outcome(rec outcome.Record) {
	c.lastOutcome.Store(c.clock.Now().UnixNano())
	c.steeredSinceOutcome.Store(0)
	in, tracked := c.tickets.take(rec.Ticket)
	if !tracked && rec.Ticket == "" && rec.RequestID != "" {
		if in, tracked = c.tickets.takeRequest(rec.RequestID); !tracked {
			c.tickets.finish(rec.RequestID)
		}
	}
	if rec.Upstream == "" && !tracked {
		return // answered by the sidecar itself (shed, bad request) or never routed
	}
	rt := c.routing.Load()
	engine, rtt := "", time.Duration(0)
	if rt != nil {
		engine, rtt = rt.engines[rec.Upstream], rt.rtt[rec.Upstream]
	}
	ok := rec.Status > 0 && rec.Status < 500 && !rec.UpstreamFailure
	if tracked && rec.Attempts > 1 && rec.Upstream != in.address {
		// The primary failed and Envoy went down the list: that is the primary's error.
		c.observe(in.engine, false, 0, 0)
	}
	if engine != "" {
		var ttft, itl time.Duration
		if ok {
			// Engine time only: the round trip is the network's, not the engine's.
			ttft = max(firstToken(rec)-rtt, time.Microsecond)
			itl = decodePerChunk(rec)
		}
		c.observe(engine, ok, ttft, itl)
	}
	if rec.Attempts > 1 {
		c.retries.Spent(rec.Attempts - 1)
	}
}

// firstToken is the time to the first body byte, or to the response headers when Envoy did
// not log the former.
func firstToken(rec outcome.Record) time.Duration {
	if rec.TTFT > 0 {
		return rec.TTFT
	}
	return rec.TTFB
}

// SSEChunkBytes is about one streamed token's SSE event ("data: {...}\n\n"). Only ratios
// between engines matter to the outlier check, so the constant need not be exact.
const SSEChunkBytes = 150

// decodePerChunk estimates inter-token latency from the decode time and the body size;
// 0 when the body is too small to say.
func decodePerChunk(rec outcome.Record) time.Duration {
	if rec.Decode <= 0 || rec.BodyBytes < 4*SSEChunkBytes {
		return 0
	}
	return time.Duration(float64(rec.Decode) * SSEChunkBytes / float64(rec.BodyBytes))
}

func (c *Core) observe(engine string, ok bool, ttft, itl time.Duration) {
	c.outliers.Observe(guard.Outcome{Engine: engine, OK: ok, TTFT: ttft, ITL: itl})
	if c.cfg.OnEngineOutcome != nil {
		c.cfg.OnEngineOutcome(engine, ok)
	}
}

// Penalties is the current outlier evaluation.
func (c *Core) Penalties() *guard.Penalties { return c.outliers.Penalties() }

// InFlight returns the requests in flight per engine name.
func (c *Core) InFlight() map[string]int64 {
	out := map[string]int64{}
	if r := c.routing.Load(); r != nil {
		for addr, engine := range r.engines {
			out[engine] = c.loads.InFlight(addr)
		}
	}
	return out
}

// ObserveEngineLoad records what the engine at addr reports it holds, as its scraped
// load gauges state it, beyond this core's own requests there and its peers' (the node's
// other sidecars, as they last sent them: SetPeerInFlight): that is other routers' work
// (other nodes' sidecars, and peers that send nothing), which the picker's least-work
// choice counts until the next observation replaces it; bounded loads keep to the
// requests in flight from the core and its peers. When the engine
// states its KV cache's use and capacity (vLLM's kv_cache_usage_perc and
// cache_config_info), its running requests weigh the tokens they hold, the prompt tokens
// it still has to prefill Config.PrefillWeight times more (engineCounters.inPrefill, when the engine
// states the counters: a prompt being prefilled delays every request that arrives behind
// it, where one decoding only slows their steps), and each waiting one the mean work of
// this core's recent requests; otherwise every request, running or waiting, weighs that
// mean (DecodeWork before the core has routed any). The tokens a
// request holds say what it costs, where a count prices a 100k-token prompt as a short
// one (docs/results/README.md has what the difference measured). A result that is not a
// positive finite number forgets the observation (ForgetEngineLoad is the failed scrape's
// call), so the core falls back to its own counts. It also records the tokens the engine
// has written into its KV cache and the cache's capacity (Load.KVWritten and KVTokens):
// a key's home expires once its engine has written more than its cache holds since the
// key's placement (picker.Homes), and the key is then placed as a new one; and, for the
// room a key's home has (picker.Table.Room), the tokens the running requests hold, the
// tokens the waiting ones will take before a new request (each the mean prompt of this
// core's recent requests) and the tokens per second the running ones free as they finish
// (engineCounters.finishRate times the tokens a running request holds on average). Call
// it from the scraper, not per request.
func (c *Core) ObserveEngineLoad(addr string, l enginemetrics.Load) {
	o := picker.Observation{Waiting: int64(l.Waiting), KVFreed: -1} // -1: finishes not stated
	if written, ok := l.KVWritten(); ok && l.KVTokens > 0 {
		o.KVWritten, o.KVCapacity = int64(written), int64(l.KVTokens)
		if c.clock.Now().Sub(c.started) < homeWarmup { // only the warm-up reads them
			c.firstLook(addr, written > float64(c.routedWork.Load()))
		}
	}
	held, kv := l.KVHeld()
	var rest float64
	var peerRequests int64
	mean := c.requestWork()
	if kv {
		prefill, finishes, stated := c.engineCounters(addr, l)
		o.KVHeld = int64(held)
		// The waiting requests take their blocks before a new one (vLLM admits in order):
		// each at the mean prompt of the requests this core routed, as each weighs the
		// mean work in rest.
		if l.Waiting > 0 {
			o.KVWaiting = int64(math.Round(l.Waiting * max(mean-float64(c.cfg.DecodeWork), 0)))
		}
		if stated {
			o.KVFreed = 0
			if finishes > 0 && l.Running > 0 {
				o.KVFreed = int64(math.Round(finishes * held / l.Running))
			}
		}
		rest = held + c.cfg.PrefillWeight*prefill + l.Waiting*mean
	} else {
		peerRequests = c.peerInFlightAt(addr).Requests
	}
	c.loads.Observe(addr, o, func(requests, work, peerWork int64) int64 {
		others := rest - float64(work+peerWork) // peerWork is the peers' work SetPeerInFlight summed
		if !kv {
			others = (l.Requests() - float64(requests+peerRequests)) * mean
		}
		if !(others > 0) || math.IsInf(others, 0) {
			return 0
		}
		return int64(math.Round(others))
	})
}

// engineCounters reads what the engine at addr's counters say since the previous scrape:
// the prompt tokens it still has to prefill (inPrefill) and the requests it finishes per
// second (finishRate; stated is false when this scrape does not state them).
func (c *Core) engineCounters(addr string, l enginemetrics.Load) (prefill, finishes float64, stated bool) {
	now := c.clock.Now()
	c.countersMu.Lock()
	defer c.countersMu.Unlock()
	if c.counters == nil {
		c.counters = map[string]*engineCounters{}
	}
	st := c.counters[addr]
	if st == nil {
		st = new(engineCounters)
		c.counters[addr] = st
	}
	finishes, stated = st.finishRate(l, now)
	return st.inPrefill(l), finishes, stated
}

// inPrefill is the prompt tokens the engine still has to prefill: the prompts it has
// scheduled and not answered (Load.InPrefill), above what the same difference of counters
// was when the engine was last seen idle (nothing running or waiting: a prompt vLLM looks
// up again, a preempted request, stays in the difference, and an idle engine has nothing
// in prefill), less the share of them its prefix cache serves. vLLM counts a prompt's
// queries and hits when it schedules the request; that share is the engine's hits over
// its queries since the previous scrape, halved toward the one before at each scrape. 0
// when the engine does not state the counters.
func (st *engineCounters) inPrefill(l enginemetrics.Load) float64 {
	d, ok := l.InPrefill()
	if !ok {
		return 0
	}
	if q := l.PrefixQueries - st.queries; st.counted && q > 0 {
		if h := (l.PrefixHits - st.hits) / q; h >= 0 && h <= 1 {
			if st.rated {
				h = (st.hitRate + h) / 2
			}
			st.hitRate, st.rated = h, true
		}
	}
	st.queries, st.hits, st.counted = l.PrefixQueries, l.PrefixHits, true
	if l.Running == 0 && l.Waiting == 0 {
		st.base = d
	}
	return max(d-st.base, 0) * (1 - st.hitRate)
}

// finishWindow is the time constant over which finishRate smooths an engine's finishes: a
// scrape every 50 ms sees one now and then, and an engine that runs long agentic turns
// finishes one every several seconds. On the simulator 2 s and 10 s measured as 5 s does
// (docs/results/README.md).
const finishWindow = 5 * time.Second

// finishRate is the requests the engine finishes per second (vllm:request_success_total),
// smoothed exponentially over finishWindow: 0 until two scrapes stated it; ok is false
// when this scrape does not state it.
func (st *engineCounters) finishRate(l enginemetrics.Load, now time.Time) (rate float64, ok bool) {
	if math.IsNaN(l.Finished) || math.IsInf(l.Finished, 0) {
		return 0, false
	}
	if st.at.IsZero() {
		st.finished, st.at = l.Finished, now
		return 0, true
	}
	if dt := now.Sub(st.at).Seconds(); dt > 0 {
		if dt != st.dt { // scrapes come at one interval: one exp per change of it
			st.dt, st.alpha = dt, 1-math.Exp(-dt/finishWindow.Seconds())
		}
		d := max(l.Finished-st.finished, 0) // a restarted engine counts from 0
		st.rate += st.alpha * (d/dt - st.rate)
	}
	st.finished, st.at = l.Finished, now
	return st.rate, true
}

// firstLook records what the core's first look at an engine's KV-cache counters said
// (see warmingUp): one engine that had written into its cache more than the work this core
// had steered anywhere by then (routedWork: requests steered before the first scrape of a
// fresh fleet write into its caches too) makes the caches warm, and engines that had not
// make them cold unless one did.
func (c *Core) firstLook(addr string, written bool) {
	c.firstLooksMu.Lock()
	defer c.firstLooksMu.Unlock()
	if _, seen := c.firstLooks[addr]; seen {
		return
	}
	if c.firstLooks == nil {
		c.firstLooks = map[string]struct{}{}
	}
	c.firstLooks[addr] = struct{}{}
	if written {
		c.caches.Store(cachesWarm)
	} else {
		c.caches.CompareAndSwap(cachesUnknown, cachesCold)
	}
}

// ForgetEngineLoad drops the engine's observed load and KV-cache counters (its scrape
// failed): the least-work choice sees only this core's own requests there until the next
// observation, and until then the engine neither takes overflow (an engine that cannot be
// scraped, often one overloaded or down, would look empty) nor lets requests overflow
// from it, and its homes do not expire.
func (c *Core) ForgetEngineLoad(addr string) {
	c.loads.SetObserved(addr, 0)
	c.loads.SetWaiting(addr, 0)
	c.loads.SetKVWritten(addr, 0, 0)
	c.countersMu.Lock()
	delete(c.counters, addr)
	c.countersMu.Unlock()
}

// LoadTarget is an engine whose load gauges the sidecar scrapes.
type LoadTarget struct {
	Address    string // the engine's address, as ObserveEngineLoad takes it
	MetricsURL string
}

// LoadTargets appends to dst every engine of the current snapshot that has a share of
// some model (EDS priority 0, not draining) or is one of its overflow engines
// (Config.OverflowEngines), and has a published metrics URL, sorted by address: the
// engines the picker weighs, and so the ones worth scraping.
func (c *Core) LoadTargets(dst []LoadTarget) []LoadTarget {
	r := c.routing.Load()
	if r == nil {
		return dst
	}
	return append(dst, r.targets...)
}

// meanWorkRequests is how many recent requests requestWork's mean remembers: each new
// one weighs 1/meanWorkRequests.
const meanWorkRequests = 256

// requestWork is the mean work of the requests this core steered, the last few hundred
// weighing most, or DecodeWork (a short request's) before any. It prices the requests
// other routers hold (ObserveEngineLoad): they come from the same clients, so they cost
// what this core's cost. The mean of only the requests in flight, which it replaced, is a
// handful of requests at a few per second and swung with each (docs/results/README.md).
func (c *Core) requestWork() float64 {
	n, w := c.routedN.Load(), c.routedWork.Load()
	c.meanMu.Lock()
	defer c.meanMu.Unlock()
	if dn := n - c.meanN; dn > 0 {
		batch := float64(w-c.meanW) / float64(dn)
		if c.meanN == 0 {
			c.meanWork = batch
		} else {
			keep := math.Pow(1-1.0/meanWorkRequests, float64(dn))
			c.meanWork = keep*c.meanWork + (1-keep)*batch
		}
		c.meanN, c.meanW = n, w
	}
	if c.meanN == 0 {
		return float64(max(c.cfg.DecodeWork, 1))
	}
	return c.meanWork
}

// Placement is a routing key's upper 48 bits (picker.KeyBits) and the engine address a
// sidecar sent the key's request to: the meridian.v1 Placement the sidecars of a node
// exchange through the control server.
type Placement struct {
	Key     uint64
	Address string
	// KVStamp is the engine's KV-cache writes when the key was placed there (picker.Homes'
	// stamp), by the placing sidecar's scrape; 0 when it had none.
	KVStamp int64
}

// AppendPlacements appends the keys whose engine this core changed since the previous
// call (a new key, or one the least-work choice moved), oldest first, for the node's other
// sidecars; when more changed than the journal holds, the oldest are lost. Placements the
// core adopted from peers are not among them. Call it from the exchange, not per request.
func (c *Core) AppendPlacements(dst []Placement) []Placement {
	c.drainMu.Lock()
	defer c.drainMu.Unlock()
	c.drained = c.homes.Drain(c.drained, func(key uint64, id uint32, stamp int64) {
		if addr := c.loads.Address(id); addr != "" {
			dst = append(dst, Placement{Key: key, Address: addr, KVStamp: stamp})
		}
	})
	return dst
}

// AdoptPlacements records what the node's other sidecars placed: a key's next request
// here treats the placement's engine as its home. It returns how many it adopted;
// placements on addresses that are in none of this core's tables are ignored.
func (c *Core) AdoptPlacements(ps []Placement) int {
	n := 0
	for _, p := range ps {
		if id, stamp := c.loads.Stamp(p.Address); id != 0 {
			if p.KVStamp > 0 {
				stamp = p.KVStamp
			}
			c.homes.Adopt(p.Key, id, stamp)
			n++
		}
	}
	return n
}

// ObservedLoad returns the work other routers were last observed to hold, per engine
// name (ObserveEngineLoad), for the sidecar's metrics.
func (c *Core) ObservedLoad() map[string]int64 {
	out := map[string]int64{}
	if r := c.routing.Load(); r != nil {
		for addr, engine := range r.engines {
			if w := c.loads.Observed(addr); w > 0 {
				out[engine] = w
			}
		}
	}
	return out
}

// HomesExpired is how many requests found their key's home expired: its engine's KV cache
// had turned over since the placement (picker.Homes.Expired).
func (c *Core) HomesExpired() int64 { return c.homes.Expired() }

// Tracked is how many requests hold a ticket.
func (c *Core) Tracked() int { return c.tickets.len() }

// RetryCurve is the retry budget curve in force: the configured one until a policy brings
// the control server's.
func (c *Core) RetryCurve() policy.RetryCurve { return c.retries.Curve() }

// InFlightTotal is the number of requests in flight from this core to all engines.
func (c *Core) InFlightTotal() int64 { return c.loads.Total() }

// Weights calls fn with every engine of the model's current table and its weight (the
// published weight times the engine's penalty).
func (c *Core) Weights(model string, fn func(engine string, weight float64)) {
	r := c.routing.Load()
	if r == nil {
		return
	}
	m := r.models[model]
	if m == nil {
		return
	}
	for i := range m.table.Len() {
		ep := m.table.Endpoint(i)
		fn(ep.Engine, ep.Weight)
	}
}
