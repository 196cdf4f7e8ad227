package meridianv1

// MaxPlacementsPerBatch bounds one Placements message on the ExchangePlacements stream: a
// sidecar sends at most this many placements in a batch, and the control server refuses a
// larger one (InvalidArgument), so that one buggy sidecar cannot make it hold and relay
// more.
const MaxPlacementsPerBatch = 8192

// MaxInFlightEngines bounds one InFlight message on the WatchInFlight stream: a sidecar
// lists at most this many engines, and a watcher refuses a larger snapshot, so that one
// buggy peer cannot make it hold more.
const MaxInFlightEngines = 4096
