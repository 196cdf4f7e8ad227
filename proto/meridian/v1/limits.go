package meridianv1

// MaxPlacementsPerBatch bounds one Placements message on the ExchangePlacements stream: a
// sidecar sends at most this many placements in a batch, and the control server refuses a
// larger one (InvalidArgument), so that one buggy sidecar cannot make it hold and relay
// more.
const MaxPlacementsPerBatch = 8192
