package sim

// replica is which of its pool's router replicas (for meridian, which of its cluster's
// sidecars) receives the request: Request.Replica, drawn per request in
// [0, Config.replicas()).
func (r *Request) replica() int { return r.Replica }
