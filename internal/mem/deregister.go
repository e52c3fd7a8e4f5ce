package mem

// Deregister removes the region from its table; it fails with ErrBusy
// while work is outstanding on it.
func (r *Region) Deregister() error { return r.table.Deregister(r) }
