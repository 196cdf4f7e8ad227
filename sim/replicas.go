package sim

// replicas is how many sidecars (and Envoys) each cluster runs in meridian's deployment.
func (c *Config) replicas() int { return 1 }

// replica is which of its cluster's replicas receives the request.
func (r *Request) replica() int { return 0 }
